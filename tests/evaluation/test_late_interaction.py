"""Multi-vector late interaction (issue 12, item 5): CraterBench-R's instance tokens re-rank a single-vector
shortlist. Each piece against an independent brute force: the seeds against a plain-Python farthest-point
loop, the groups against argmax cosine, the tokens against per-group means, the score against nested
sum-max loops, K = H*W against the plain Chamfer similarity, the re-ranking against sorting by hand; then
the whole path through ``evaluate_benchmarks`` and the ``eval.yaml`` options."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image

from aggzoo.data.retrieval_set import RetrievalSet
from aggzoo.errors import ConfigError
from aggzoo.evaluation.benchmarks import evaluate_benchmarks
from aggzoo.evaluation.late_interaction import (
    InstanceTokenRerank,
    assign_to_seeds,
    farthest_point_seeds,
    instance_tokens,
    late_interaction_scores,
    patch_tokens,
)
from aggzoo.evaluation.options import (
    EvaluationOptions,
    ExtractionOptions,
    OutputOptions,
    RerankOptions,
    SearchOptions,
)
from aggzoo.evaluation.search import search
from aggzoo.evaluation.test_time import build_reranker
from aggzoo.models.backbones.timm_backbone import TimmBackbone
from aggzoo.models.heads.gem import GeM
from aggzoo.models.vpr_model import VPRModel


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _fps_reference(tokens: np.ndarray, k: int) -> list[int]:
    """Farthest-point sampling on cosine distance, one image, in float64 loops."""
    unit = _unit(tokens.astype(np.float64))
    mean = _unit(unit.mean(axis=0))
    seeds = [int(np.argmax(unit @ mean))]
    while len(seeds) < k:
        best, best_i = np.inf, -1
        for i in range(len(unit)):
            if i in seeds:
                continue
            nearest = max(float(unit[i] @ unit[s]) for s in seeds)
            if nearest < best:
                best, best_i = nearest, i
        seeds.append(best_i)
    return seeds


def test_seeds_are_farthest_point_sampling_on_cosine() -> None:
    tokens = torch.randn(3, 40, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    seeds = farthest_point_seeds(torch.nn.functional.normalize(tokens, dim=-1), 7)
    for b in range(3):
        assert seeds[b].tolist() == _fps_reference(tokens[b].numpy(), 7)
        assert len(set(seeds[b].tolist())) == 7


def test_every_token_goes_to_its_most_cosine_similar_seed() -> None:
    unit = torch.nn.functional.normalize(torch.randn(2, 30, 6, generator=torch.Generator().manual_seed(1)), dim=-1)
    seeds = farthest_point_seeds(unit, 5)
    groups = assign_to_seeds(unit, seeds)
    for b in range(2):
        for t in range(30):
            cosines = [float(unit[b, t] @ unit[b, s]) for s in seeds[b]]
            assert groups[b, t] == int(np.argmax(cosines))
        assert groups[b, seeds[b]].tolist() == list(range(5))  # each seed heads its own group


def test_a_duplicated_token_cannot_empty_a_seed_group() -> None:
    unit = torch.nn.functional.normalize(torch.tensor([[[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]]), dim=-1)
    groups = assign_to_seeds(unit, torch.tensor([[0, 1]]))  # two identical seeds
    assert groups[0].tolist() == [0, 1, 0]


def test_instance_tokens_are_the_normalised_group_means() -> None:
    tokens = torch.randn(2, 24, 5, generator=torch.Generator().manual_seed(2)) * 3
    out = instance_tokens(tokens, 4)
    assert out.shape == (2, 4, 5)
    unit = torch.nn.functional.normalize(tokens, dim=-1)
    groups = assign_to_seeds(unit, farthest_point_seeds(unit, 4))
    for b in range(2):
        for j in range(4):
            mean = unit[b][groups[b] == j].double().mean(dim=0)
            np.testing.assert_allclose(out[b, j].double().numpy(), _unit(mean.numpy()), atol=1e-6)
    with pytest.raises(ConfigError, match=r"evaluation.rerank.tokens=25.*1 <= evaluation.rerank.tokens <= 24"):
        instance_tokens(tokens, 25)


def test_the_score_is_the_sum_over_query_tokens_of_the_best_match() -> None:
    gen = torch.Generator().manual_seed(3)
    q, db = torch.randn(2, 3, 4, generator=gen), torch.randn(2, 5, 6, 4, generator=gen)
    scores = late_interaction_scores(q, db)
    for b in range(2):
        for m in range(5):
            expected = sum(max(float(q[b, i] @ db[b, m, j]) for j in range(6)) for i in range(3))
            assert scores[b, m].item() == pytest.approx(expected, abs=1e-5)


def test_all_patches_as_tokens_give_the_plain_chamfer_score() -> None:
    gen = torch.Generator().manual_seed(4)
    maps_q, maps_d = torch.randn(1, 8, 3, 4, generator=gen), torch.randn(1, 8, 3, 4, generator=gen)
    tq, td = patch_tokens(maps_q), patch_tokens(maps_d)                  # [1, 12, 8]
    assert torch.equal(tq[0, 5], maps_q[0, :, 1, 1])                       # row-major positions
    full_q, full_d = instance_tokens(tq, 12), instance_tokens(td, 12)
    uq = _unit(tq[0].double().numpy())
    ud = _unit(td[0].double().numpy())
    chamfer = (uq @ ud.T).max(axis=1).sum()
    assert late_interaction_scores(full_q, full_d[:, None]).item() == pytest.approx(chamfer, abs=1e-5)
    # ...because every group is one token: the K tokens are the normalised patches, re-ordered.
    assert sorted(map(tuple, np.round(full_d[0].double().numpy(), 5))) == sorted(map(tuple, np.round(ud, 5)))


def test_rerank_sorts_the_shortlist_by_late_interaction_and_keeps_the_tail() -> None:
    rng = np.random.default_rng(5)
    n, nq, k, c, m = 60, 9, 4, 8, 10
    db = _unit(rng.standard_normal((n, k, c))).astype(np.float16)
    q = _unit(rng.standard_normal((nq, k, c))).astype(np.float16)
    predictions = np.stack([rng.permutation(n)[:20] for _ in range(nq)])
    predictions[0, 7] = -1  # a padded slot ranks last among the shortlist
    out = InstanceTokenRerank(top_m=m, tokens=k, query_chunk=4).rerank(db, q, predictions)
    for i in range(nq):
        ids = [int(x) for x in predictions[i, :m]]
        score = {d: -np.inf if d < 0 else sum((db[d].astype(np.float64) @ q[i, t].astype(np.float64)).max()
                                             for t in range(k)) for d in ids}
        assert out[i, :m].tolist() == sorted(ids, key=lambda d: -score[d])
        assert out[i, m:].tolist() == predictions[i, m:].tolist()
    assert out[0, m - 1] == -1


def _noise_set(folder: Path, n: int = 6) -> RetrievalSet:
    """Database images of random noise; each query is its database image with mild noise."""
    rng = np.random.default_rng(6)
    paths: dict[str, list[Path]] = {"db": [], "q": []}
    for name in paths:
        (folder / name).mkdir(parents=True)
    for i in range(n):
        base = rng.integers(0, 255, (64, 64, 3))
        for name, img in (("db", base), ("q", np.clip(base + rng.normal(0, 25, base.shape), 0, 255))):
            Image.fromarray(img.astype(np.uint8)).save(folder / name / f"{i:02d}.png")
            paths[name].append(folder / name / f"{i:02d}.png")
    return RetrievalSet("noise", tuple(paths["db"]), tuple(paths["q"]), tuple(np.array([i]) for i in range(n)))


def _to_tensor(rgb: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.array(rgb)).permute(2, 0, 1).float() / 255


def test_evaluate_benchmarks_reranks_with_float16_token_files(tmp_path: Path) -> None:
    rs = _noise_set(tmp_path / "images")
    torch.manual_seed(0)
    model = VPRModel(TimmBackbone("test_resnet"), GeM).eval()
    store = tmp_path / "store"
    options = EvaluationOptions(ks=(1, 3), extraction=ExtractionOptions(batch_size=3),
                                search=SearchOptions(store_dir=store), outputs=OutputOptions(pictures=False),
                                rerank=RerankOptions(method="instance_tokens", k=4, tokens=2))
    (result,) = evaluate_benchmarks(model, [rs], _to_tensor, options)
    db_tokens = np.load(store / "noise_database_tokens.npy", mmap_mode="r")
    q_tokens = np.load(store / "noise_queries_tokens.npy", mmap_mode="r")
    # Independent recomputation: the backbone's last map on each image, instance tokens, float16.
    images = torch.stack([_to_tensor(np.asarray(Image.open(p))) for p in rs.database_paths])
    with torch.inference_mode():
        last = model.forward_features(images).last
        expected = instance_tokens(patch_tokens(last), 2).numpy().astype(np.float16)
        descriptors = model(images).numpy()
    assert db_tokens.dtype == np.float16 and db_tokens.shape == (6, 2, last.shape[1])
    np.testing.assert_allclose(db_tokens.astype(np.float32), expected.astype(np.float32), atol=2e-3)
    with torch.inference_mode():
        queries = model(torch.stack([_to_tensor(np.asarray(Image.open(p))) for p in rs.query_paths])).numpy()
    shortlist = search(descriptors, queries, 4)
    reranked = InstanceTokenRerank(top_m=4, tokens=2).rerank(db_tokens, q_tokens, shortlist)
    assert np.array_equal(result.predictions[:, :3], reranked[:, :3])
    stats = result.summary()["instance_tokens"]
    assert stats["tokens"] == 2 and stats["shortlist"] == 4 and stats["token_bytes_per_image"] == 2 * 2 * last.shape[1]
    assert set(stats["recalls_before_rerank"]) == {"1", "3"} and stats["rerank_ms_per_query"] >= 0


def test_the_eval_config_names_the_options_and_bad_values_are_refused() -> None:
    config = OmegaConf.load(Path(__file__).resolve().parents[2] / "conf" / "eval.yaml")
    assert {"method", "k", "tokens"} <= set(config.evaluation.rerank)
    assert build_reranker(RerankOptions("instance_tokens", k=50, tokens=8)) == InstanceTokenRerank(top_m=50, tokens=8)
    assert build_reranker(RerankOptions("instance_tokens", k=None, tokens=16)).top_m == 100
    with pytest.raises(ConfigError, match="evaluation.rerank.method=colbert is not a re-ranker"):
        build_reranker(RerankOptions("colbert"))
    with pytest.raises(ConfigError, match="evaluation.rerank.k=0"):
        build_reranker(RerankOptions("instance_tokens", k=0, tokens=16))


def test_token_extraction_leaves_the_model_in_its_mode(tmp_path: Path) -> None:
    from aggzoo.evaluation.late_interaction import extract_instance_tokens

    rs = _noise_set(tmp_path, n=2)
    model = VPRModel(TimmBackbone("test_resnet"), GeM).eval()
    tokens = extract_instance_tokens(model, rs.database_paths, _to_tensor, ExtractionOptions(), tokens=2,
                                     out_path=tmp_path / "t.npy")
    assert not model.training and not any(m.training for m in model.modules())
    assert np.load(tmp_path / "t.npy", mmap_mode="r").shape == tokens.shape == (2, 2, model.backbone.out_channels)
