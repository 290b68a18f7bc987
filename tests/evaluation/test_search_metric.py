"""``evaluation.metric``: the search by squared L2 distance (``faiss.IndexFlatL2``, as the dVGL benchmark and
VPR-methods-evaluation search) beside the inner product, through every path of the one index builder,
and the model's protocol carrying it.

Independent expectations: the brute-force numpy ranking by squared distance (float64, ties by index) of
descriptors that are not unit-norm; a two-vector case where the two metrics disagree by construction;
for CricaVPR's PCA (Lu-Feng/CricaVPR ``util.compute_pca``: sklearn ``PCA(4096)``, no whitening, no L2,
``faiss.IndexFlatL2``), the projection computed from a numpy SVD of the centred training set.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from aggzoo.data.retrieval_set import RetrievalSet
from aggzoo.errors import ConfigError
from aggzoo.evaluation.benchmarks import evaluate_benchmarks
from aggzoo.evaluation.index import build_index
from aggzoo.evaluation.options import (
    REFINE_STORES,
    EvaluationOptions,
    OutputOptions,
    PostprocessOptions,
    RerankOptions,
    SearchOptions,
)
from aggzoo.evaluation.postprocess import WHITENING_KINDS, PCAWhitening, SuperGlobalRerank, rerank_metric_check
from aggzoo.evaluation.protocol import EvalProtocol
from aggzoo.evaluation.search import search, search_with_scores
from aggzoo.hub.cfg import PretrainedCfg
from aggzoo.run.preflight import evaluation_option_problems


def _data(n: int = 64, q: int = 12, d: int = 8, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Rows of very different norms (0.1 .. 10): inner product and L2 rank them differently."""
    rng = np.random.default_rng(seed)
    db = rng.standard_normal((n, d)) * rng.uniform(0.1, 10.0, (n, 1))
    queries = rng.standard_normal((q, d)) * rng.uniform(0.1, 10.0, (q, 1))
    return db.astype(np.float32), queries.astype(np.float32)


def _brute_force_l2(db: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    dist = ((queries.astype(np.float64)[:, None, :] - db.astype(np.float64)[None]) ** 2).sum(-1)
    order = np.argsort(dist, axis=1, kind="stable")[:, :k]
    return order, np.take_along_axis(dist, order, axis=1)


def test_the_two_metrics_disagree_where_they_must() -> None:
    # q = e1; database rows e1 and 3 e1: inner product prefers the long one (3 > 1), L2 the equal one (0 < 4)
    db = np.array([[1.0, 0.0], [3.0, 0.0]], np.float32)
    q = np.array([[1.0, 0.0]], np.float32)
    assert search(db, q, 1)[0, 0] == 1 and search(db, q, 1, SearchOptions(metric="ip"))[0, 0] == 1
    scores, ids = search_with_scores(db, q, 2, SearchOptions(metric="l2"))
    assert ids.tolist() == [[0, 1]] and scores.tolist() == [[0.0, 4.0]]  # squared distances, ascending


@pytest.mark.parametrize("backend", ["faiss", "torch"])
def test_l2_search_is_the_brute_force_l2_ranking(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    db, queries = _data()
    if backend == "torch":
        monkeypatch.setattr("aggzoo.evaluation.search.faiss", None)  # the torch fallback
    expected_ids, expected_dist = _brute_force_l2(db, queries, 10)
    scores, ids = search_with_scores(db, queries, 10, SearchOptions(metric="l2"))
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_allclose(scores, expected_dist, rtol=1e-4, atol=1e-3)
    ip = search(db, queries, 10)
    assert (ip[:, 0] != ids[:, 0]).mean() > 0.3  # not the inner-product ranking on these rows
    ip_expected = np.argsort(-(queries.astype(np.float64) @ db.T.astype(np.float64)), axis=1, kind="stable")[:, :10]
    np.testing.assert_array_equal(ip, ip_expected)  # the default still ranks by inner product


def test_l2_ties_are_ordered_by_index() -> None:
    db, queries = _data(n=20, q=3)
    db = np.concatenate([db, db])  # row i and i + 20 tie exactly
    ids = search(db, queries, 40, SearchOptions(metric="l2"))
    expected, _ = _brute_force_l2(db, queries, 40)
    np.testing.assert_array_equal(ids, expected)
    ids_k1 = search(db, queries, 1, SearchOptions(metric="l2"))  # the tie straddles k: the lower index wins
    np.testing.assert_array_equal(ids_k1[:, 0], expected[:, 0])


@pytest.mark.parametrize("store", REFINE_STORES)
def test_two_stage_l2_search_rescores_by_l2(store: str, tmp_path: Path) -> None:
    db, queries = _data()
    path = tmp_path / "db.npy"
    np.save(path, db)
    stored = np.load(path, mmap_mode="r") if store == "disk" else db
    expected_ids, expected_dist = _brute_force_l2(db, queries, 5)
    # The shortlist holds every row: whatever PQ ranks, the exact second stage must give the L2 top-k.
    scores, ids = search_with_scores(stored, queries, 5, SearchOptions(index="PQ2x4", refine=len(db), refine_store=store,
                                                                    metric="l2"))
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_allclose(scores, expected_dist, rtol=1e-4, atol=1e-3)


def test_approximate_and_l2_only_types_build_for_l2_and_a_prebuilt_index_must_match() -> None:
    db, queries = _data()
    expected, _ = _brute_force_l2(db, queries, 5)
    # exhaustive search through an HNSW graph of 64 rows with a wide beam: the exact L2 top-5
    np.testing.assert_array_equal(search(db, queries, 5, SearchOptions(index="HNSW8", search_params="efSearch=64",
                                                                 metric="l2")),
                                  expected)
    search(db, queries, 5, SearchOptions(index="LSHrt", metric="l2"))  # built for L2 only: fine for an L2 search
    with pytest.raises(ValueError, match="L2 metric only"):
        search(db, queries, 5, SearchOptions(index="LSHrt"))  # ... refused for inner product, as before
    flat_ip = build_index(db)
    with pytest.raises(ValueError, match="ranks by ip.*metric='l2'"):
        search(db, queries, 5, SearchOptions(metric="l2"), prebuilt=flat_ip)
    np.testing.assert_array_equal(search(db, queries, 5, SearchOptions(metric="l2"),
                                         prebuilt=build_index(db, SearchOptions(metric="l2"))), expected)


def test_bad_metrics_and_superglobal_after_l2_are_config_errors() -> None:
    db, queries = _data(n=8, q=2)
    with pytest.raises(ConfigError, match="evaluation.search.metric='cosine'"):
        search(db, queries, 2, SearchOptions(metric="cosine"))
    with pytest.raises(ConfigError, match="superglobal.*metric=l2"):
        rerank_metric_check(SuperGlobalRerank(), "l2")
    rerank_metric_check(SuperGlobalRerank(), "ip")
    options = EvaluationOptions(search=SearchOptions(metric="l2", index="LSHrt"), rerank=RerankOptions(method=True))
    problems = evaluation_option_problems(options, 8)
    assert len(problems) == 1 and "superglobal" in problems[0]  # LSHrt is fine for L2
    with pytest.raises(ConfigError, match="cosine"):  # refused when the options are made
        EvaluationOptions(search=SearchOptions(metric="cosine"))


def test_the_protocol_carries_the_metric_of_the_weights() -> None:
    cfg = PretrainedCfg(architecture="gem_resnet50conv4", tag="x", eval_metric="l2", eval_whitening_kind="project")
    protocol = EvalProtocol.from_pretrained_cfg(cfg)
    assert (protocol.metric, protocol.whitening_kind) == ("l2", "project")
    assert protocol.overridden_by({"metric": "ip"}).metric == "ip"
    assert PretrainedCfg.from_json(cfg.to_dict()).eval_metric == "l2"  # a save_pretrained folder keeps it
    assert EvalProtocol.from_pretrained_cfg(PretrainedCfg()).metric == "ip"  # the default
    with pytest.raises(ConfigError, match="evaluation.search.metric"):
        protocol.overridden_by({"metric": "cos"})


# -- CricaVPR's optional PCA: sklearn's plain projection (no whitening, no L2), searched by L2 ----------


def test_project_pca_is_the_plain_projection_and_l2_search_ranks_as_upstream(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    scales = np.linspace(3.0, 0.2, 12)  # distinct variances: the kept subspace is well defined
    offset = rng.standard_normal(12)
    train, db, queries = ((rng.standard_normal((n, 12)) * scales + offset).astype(np.float32) for n in (300, 50, 9))
    pca = PCAWhitening.fit(train, dim=5, **WHITENING_KINDS["project"])
    # Independent: sklearn's PCA(5) is the SVD of the centred training set, transform = (x - mean) @ Vt[:5].T
    mean = train.astype(np.float64).mean(axis=0)
    vt = np.linalg.svd(train - mean, full_matrices=False)[2][:5]
    ref_db, ref_q = (db - mean) @ vt.T, (queries - mean) @ vt.T
    ours_db, ours_q = pca(db), pca(queries)
    signs = np.sign((ours_db * ref_db).sum(axis=0))  # each axis' sign is a convention (svd_flip in sklearn)
    np.testing.assert_allclose(ours_db, ref_db * signs, atol=1e-4)
    np.testing.assert_allclose(ours_q, ref_q * signs, atol=1e-4)
    assert np.abs(np.linalg.norm(ours_db, axis=1) - 1).min() > 1e-2  # no L2 after the projection
    expected, _ = _brute_force_l2(ref_db, ref_q, 5)  # upstream: faiss.IndexFlatL2 on the projections
    np.testing.assert_array_equal(search(ours_db, ours_q, 5, SearchOptions(metric="l2")), expected)
    assert (search(ours_db, ours_q, 5)[:, 0] != expected[:, 0]).any()  # inner product ranks them otherwise
    loaded = PCAWhitening.load(pca.save(tmp_path / "pca.npz"))
    assert loaded.l2 is False
    np.testing.assert_array_equal(loaded(db), ours_db)
    whitened = PCAWhitening.fit(train, dim=5)(db)  # the default kind: whitening + L2, as before
    np.testing.assert_allclose(np.linalg.norm(whitened, axis=1), 1.0, atol=1e-5)


class _MeanColour(torch.nn.Module):
    """The mean colour, not normalised: its norm is the brightness."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3))


def _to_tensor(image: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(image.transpose(2, 0, 1).astype(np.float32) / 255.0)


def test_evaluate_benchmarks_searches_and_fits_the_pca_the_protocol_states(tmp_path: Path) -> None:
    # Each query is a database colour; a brighter decoy of the same hue follows each colour in the
    # database: inner product prefers the decoy, L2 the colour itself.
    rng = np.random.default_rng(4)
    colours = rng.integers(40, 120, size=(12, 3))
    paths: dict[str, list[Path]] = {"db": [], "q": []}
    for name, rows in (("db", [c for colour in colours for c in (colour, 2 * colour)]), ("q", colours)):
        (tmp_path / name).mkdir()
        for i, c in enumerate(rows):
            Image.new("RGB", (4, 4), tuple(int(v) for v in c)).save(tmp_path / name / f"{i:03d}.png")
            paths[name].append(tmp_path / name / f"{i:03d}.png")
    rs = RetrievalSet("colours", tuple(paths["db"]), tuple(paths["q"]), tuple(np.array([2 * i]) for i in range(12)))
    no_pictures = OutputOptions(pictures=False)
    ip = evaluate_benchmarks(_MeanColour(), [rs], _to_tensor, EvaluationOptions(ks=(1,), outputs=no_pictures))[0]
    l2_options = EvaluationOptions(
        ks=(1,), search=SearchOptions(metric="l2"), outputs=OutputOptions(dir=tmp_path / "out", pictures=False),
        postprocess=PostprocessOptions(whitening_fit=paths["db"], whitening_dim=2, whitening_kind="project"))
    l2 = evaluate_benchmarks(_MeanColour(), [rs], _to_tensor, l2_options)[0]
    assert ip.recalls[1] == 0.0 and l2.recalls[1] == 1.0
    settings = json.loads((tmp_path / "out" / "results.json").read_text())["meta"]["settings"]
    assert (settings["metric"], settings["whitening_dim"], settings["whitening_l2"]) == ("l2", 2, False)
    with pytest.raises(ConfigError, match="whitening_kind='sklearn'"):
        sklearn = PostprocessOptions(whitening_fit=paths["db"], whitening_kind="sklearn")
        evaluate_benchmarks(_MeanColour(), [rs], _to_tensor, EvaluationOptions(postprocess=sklearn))
