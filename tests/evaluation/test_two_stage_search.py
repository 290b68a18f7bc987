"""Two-stage search (issue 12, item 4): an approximate FAISS index returns a shortlist of M candidates,
re-scored exactly against the full-precision descriptors, in RAM (FAISS's IndexRefineFlat) or memory-mapped
on disk. Small synthetic data, real FAISS."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image

from aggzoo.data.retrieval_set import RetrievalSet
from aggzoo.evaluation import options as options_module
from aggzoo.evaluation.benchmarks import evaluate_benchmarks
from aggzoo.evaluation.extraction import extract_descriptors
from aggzoo.evaluation.index import TwoStageIndex, build_index
from aggzoo.evaluation.options import (
    REFINE_STORES,
    EvaluationOptions,
    ExtractionOptions,
    OutputOptions,
    PostprocessOptions,
    RerankOptions,
    SearchOptions,
)
from aggzoo.evaluation.search import search, search_with_scores
from aggzoo.run.evaluate import PROTOCOL_KEYS

faiss = pytest.importorskip("faiss")

N, D, Q, K, M = 3000, 32, 50, 5, 40
INDEX, PARAMS = "IVF16,PQ8", "nprobe=2"


def _data(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    db = rng.standard_normal((N, D)).astype(np.float32)
    db /= np.linalg.norm(db, axis=1, keepdims=True)
    q = db[rng.choice(N, Q, replace=False)] + 0.3 * rng.standard_normal((Q, D)).astype(np.float32)
    return db, (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)


def _exact_top_k_of(shortlists: np.ndarray, db: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
    """Independent second stage: exact inner products over each query's shortlist, best k, ties by id."""
    out = np.empty((len(q), k), dtype=np.int64)
    for i, ids in enumerate(shortlists):
        ids = ids[ids >= 0]
        scores = db[ids].astype(np.float64) @ q[i].astype(np.float64)
        out[i] = ids[np.lexsort((ids, -scores))][:k]
    return out


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray]:
    return _data()


@pytest.mark.parametrize("store", ["ram", "disk"])
def test_refined_ivfpq_returns_the_exact_top_k_of_its_shortlist(data: tuple, store: str) -> None:
    db, q = data
    index = build_index(db, SearchOptions(index=INDEX, search_params=PARAMS, refine=M, refine_store=store))
    assert isinstance(index, TwoStageIndex) and index.store == store and index.ntotal == N
    shortlists = index.shortlists(q, K)
    assert shortlists.shape == (Q, M)
    ids = search(db, q, K, prebuilt=index)
    np.testing.assert_array_equal(ids, _exact_top_k_of(shortlists, db, q, K))
    # ... and the shortlist is the first stage alone: the same IVF-PQ index without refinement.
    plain = search(db, q, M, SearchOptions(index=INDEX, search_params=PARAMS))
    np.testing.assert_array_equal(np.sort(shortlists, axis=1), np.sort(plain, axis=1))


def test_refinement_recovers_what_pq_alone_loses(data: tuple) -> None:
    db, q = data
    exact = search(db, q, 1)
    pq_only = search(db, q, 1, SearchOptions(index=INDEX, search_params="nprobe=16"))
    refined = search(db, q, 1, SearchOptions(index=INDEX, search_params="nprobe=16", refine=M))
    assert np.mean(refined == exact) > np.mean(pq_only == exact)
    assert np.mean(refined == exact) >= 0.95


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_the_memory_mapped_store_gives_the_in_ram_results(data: tuple, dtype: type, tmp_path: Path) -> None:
    db, q = data
    stored = db.astype(dtype)
    np.save(tmp_path / "database.npy", stored)
    mapped = np.load(tmp_path / "database.npy", mmap_mode="r")
    assert isinstance(mapped, np.memmap)
    disk = SearchOptions(index=INDEX, search_params=PARAMS, refine=M, refine_store="disk")
    in_ram = search_with_scores(stored, q, K, disk)
    on_disk = search_with_scores(mapped, q, K, disk)
    faiss_ram = search_with_scores(stored, q, K, SearchOptions(index=INDEX, search_params=PARAMS, refine=M,
                                                               refine_store="ram"))
    np.testing.assert_array_equal(on_disk[1], in_ram[1])
    np.testing.assert_array_equal(on_disk[0], in_ram[0])
    np.testing.assert_array_equal(on_disk[1], faiss_ram[1])  # our second stage = FAISS's IndexRefineFlat
    np.testing.assert_allclose(on_disk[0], faiss_ram[0], atol=1e-5)


def test_the_disk_store_keeps_only_codes_in_ram(data: tuple, tmp_path: Path) -> None:
    db, _ = data
    np.save(tmp_path / "database.npy", db)
    mapped = np.load(tmp_path / "database.npy", mmap_mode="r")
    on_disk = build_index(mapped, SearchOptions(index=INDEX, refine=M, refine_store="disk"))
    in_ram = build_index(db, SearchOptions(index=INDEX, refine=M, refine_store="ram"))
    assert in_ram.ram_bytes() > db.nbytes  # IndexRefineFlat keeps a float32 copy
    assert on_disk.ram_bytes() < db.nbytes / 2  # 8-byte codes + centroids instead of 128-byte rows


def test_a_shortlist_shorter_than_k_is_raised_to_k_and_bad_values_are_refused(data: tuple) -> None:
    db, q = data
    ids = search(db, q, 20, SearchOptions(index=INDEX, search_params=PARAMS, refine=3, refine_store="disk"))
    assert ids.shape == (Q, 20) and (ids >= 0).all()
    with pytest.raises(ValueError, match="refine_store"):  # a ConfigError, when the options are made
        build_index(db, SearchOptions(index=INDEX, refine=M, refine_store="cloud"))
    with pytest.raises(ValueError, match="refine"):
        build_index(db, SearchOptions(index=INDEX, refine=0))


def test_an_index_type_faiss_builds_for_l2_only_is_refused_except_as_a_disk_first_stage(data: tuple) -> None:
    db, q = data
    for index in ("HNSW16_PQ8", "ITQ32,LSHt"):
        with pytest.raises(ValueError, match="L2 metric only"):
            build_index(db, SearchOptions(index=index))
        with pytest.raises(ValueError, match="L2 metric only"):
            build_index(db, SearchOptions(index=index, refine=M, refine_store="ram"))
    # Binary ITQ codes as the first stage: the result is still the exact top-k of their shortlist.
    binary = build_index(db, SearchOptions(index="ITQ32,LSHt", refine=M, refine_store="disk"))
    ids = search(db, q, K, prebuilt=binary)
    np.testing.assert_array_equal(ids, _exact_top_k_of(binary.shortlists(q, K), db, q, K))


# -- the pipeline's search interface: evaluation.search.index / .refine / .refine_store -------------


class _MeanColour(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.normalize(x.mean(dim=(2, 3)) + 1.0, dim=1)


def _to_tensor(image: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(image.transpose(2, 0, 1).astype(np.float32) / 255.0)


def _colour_set(folder: Path) -> RetrievalSet:
    rng = np.random.default_rng(2)
    db_colours = rng.integers(0, 256, size=(40, 3))
    q_colours = np.clip(db_colours[:15] + rng.integers(-3, 4, size=(15, 3)), 0, 255)
    paths = {}
    for name, colours in (("db", db_colours), ("q", q_colours)):
        (folder / name).mkdir(parents=True)
        paths[name] = []
        for i, c in enumerate(colours):
            Image.new("RGB", (6, 4), tuple(int(v) for v in c)).save(folder / name / f"{i:03d}.png")
            paths[name].append(folder / name / f"{i:03d}.png")
    positives = tuple(np.array([i], np.int64) for i in range(15))
    return RetrievalSet("colours", tuple(paths["db"]), tuple(paths["q"]), positives)


def test_extraction_into_a_memory_mapped_file_and_its_progress_bar(tmp_path: Path, capsys) -> None:
    rs = _colour_set(tmp_path)
    in_ram = extract_descriptors(_MeanColour(), rs.database_paths, _to_tensor, ExtractionOptions(batch_size=16))
    mapped = extract_descriptors(_MeanColour(), rs.database_paths, _to_tensor,
                                 ExtractionOptions(batch_size=16, descriptor_dtype="float16", progress=True),
                                 out_path=tmp_path / "db.npy", desc="db")
    assert isinstance(mapped, np.memmap) and mapped.dtype == np.float16
    np.testing.assert_array_equal(np.load(tmp_path / "db.npy"), in_ram.astype(np.float16))
    assert "db" in capsys.readouterr().err  # the bar, when asked for
    extract_descriptors(_MeanColour(), rs.database_paths, _to_tensor, ExtractionOptions(batch_size=16))
    assert capsys.readouterr().err == ""  # none by default when stderr is not a terminal


def test_evaluate_benchmarks_with_a_two_stage_index(tmp_path: Path) -> None:
    rs = _colour_set(tmp_path / "images")
    flat = evaluate_benchmarks(_MeanColour(), [rs], _to_tensor,
                               EvaluationOptions(ks=(1, 5), outputs=OutputOptions(pictures=False)))[0]
    runs = {}
    for store in REFINE_STORES:
        out = tmp_path / store
        two_stage = SearchOptions(index="HNSW8", refine=10, refine_store=store,
                                  store_dir=tmp_path / "store" if store == "disk" else None)
        options = EvaluationOptions(ks=(1, 5), search=two_stage, outputs=OutputOptions(dir=out, pictures=False))
        runs[store] = evaluate_benchmarks(_MeanColour(), [rs], _to_tensor, options)[0]
        settings = json.loads((out / "results.json").read_text())["meta"]["settings"]
        assert settings["refine"] == 10 and settings["refine_store"] == store
    np.testing.assert_array_equal(runs["disk"].predictions, runs["ram"].predictions)
    np.testing.assert_array_equal(runs["disk"].predictions, flat.predictions)  # 40 rows: shortlist holds all
    assert runs["disk"].recalls == flat.recalls
    stored = np.load(tmp_path / "store" / "colours_database.npy", mmap_mode="r")
    assert stored.shape == (40, 3)


def test_the_eval_config_names_the_two_stage_options() -> None:
    config = OmegaConf.load(Path(__file__).resolve().parents[2] / "conf" / "eval.yaml")
    options = {f"{node}.{key}" for node in config.evaluation for key in config.evaluation[node]}
    assert {"search.index", "search.refine", "search.refine_store", "search.store_dir", "extraction.progress"} <= options
    # run.evaluation_options builds each node's options object from the node's keys, less the protocol's
    # (run.evaluate); batch size, workers and the output folder come from elsewhere in the config
    classes = {"extraction": ExtractionOptions, "test_time": options_module.TestTimeOptions, "search": SearchOptions,
               "postprocess": PostprocessOptions, "rerank": RerankOptions, "outputs": OutputOptions}
    accepted = {f"{node}.{field.name}" for node, cls in classes.items() for field in dataclasses.fields(cls)}
    assert options - set(PROTOCOL_KEYS) <= accepted


@pytest.mark.parametrize("store", ["ram", "disk"])
def test_a_shortlist_of_the_whole_database_gives_the_exact_top_k(data: tuple, store: str, tmp_path: Path) -> None:
    # With M = N every row is a candidate: whatever the first stage ranks, the exact second stage must
    # return Flat's top-k, ids and scores (the disk store read from a float32 memory-mapped file).
    db, q = data
    if store == "disk":
        np.save(tmp_path / "database.npy", db)
        db = np.load(tmp_path / "database.npy", mmap_mode="r")
    exact_scores, exact_ids = search_with_scores(db, q, K)
    scores, ids = search_with_scores(db, q, K, SearchOptions(index="IVF16,PQ4", search_params="nprobe=16", refine=N,
                                                             refine_store=store))
    np.testing.assert_array_equal(ids, exact_ids)
    np.testing.assert_allclose(scores, exact_scores, atol=1e-5)


def test_a_gpu_index_keeps_its_resources_through_the_attribute_faiss_allows() -> None:
    # faiss >= 1.8 refuses unknown attributes on its objects (the old `index.aggzoo_gpu_resources = res`
    # raised AttributeError on every GPU index); the reference goes into FAISS's own `referenced_objects`.
    from aggzoo.evaluation.index import _keep_alive

    index = faiss.IndexFlatIP(4)
    if tuple(int(v) for v in faiss.__version__.split(".")[:2]) >= (1, 8):
        with pytest.raises(AttributeError):
            index.aggzoo_gpu_resources = object()
    owner = object()
    assert _keep_alive(index, owner) is index
    assert index.referenced_objects[-1] is owner
    ivf = faiss.IndexIVFFlat(faiss.IndexFlatIP(4), 4, 2, faiss.METRIC_INNER_PRODUCT)
    quantizer_refs = list(ivf.referenced_objects)
    _keep_alive(ivf, owner)
    assert ivf.referenced_objects == [*quantizer_refs, owner]  # FAISS's own references are kept


def test_preflight_accepts_an_l2_only_first_stage_exactly_where_the_search_does() -> None:
    from aggzoo.run.preflight import evaluation_option_problems

    disk = SearchOptions(index="ITQ32,LSHt", refine=100, refine_store="disk")
    assert evaluation_option_problems(EvaluationOptions(search=disk), D) == []
    for refused in (dataclasses.replace(disk, refine_store="ram"), SearchOptions(index="ITQ32,LSHt")):
        (problem,) = evaluation_option_problems(EvaluationOptions(search=refused), D)
        assert "L2 metric only" in problem and "evaluation.search.refine_store=disk" in problem
    (problem,) = evaluation_option_problems(EvaluationOptions(search=SearchOptions(index="IVF16,Nonsense")), D)
    assert "not a FAISS index_factory string" in problem
