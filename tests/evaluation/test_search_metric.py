"""``evaluation.metric``: the search by squared L2 distance (``faiss.IndexFlatL2``, as the dVGL benchmark and
VPR-methods-evaluation search) beside the inner product, through every path of the one index builder,
and the model's protocol carrying it.

Independent expectations: the brute-force numpy ranking by squared distance (float64, ties by index) of
descriptors that are not unit-norm; a two-vector case where the two metrics disagree by construction.
"""

from __future__ import annotations

import numpy as np
import pytest

from aggzoo.errors import ConfigError
from aggzoo.evaluation import retrieval
from aggzoo.evaluation.postprocess import SuperGlobalRerank
from aggzoo.evaluation.protocol import EvalProtocol
from aggzoo.evaluation.retrieval import (
    REFINE_STORES,
    build_index,
    rerank_metric_check,
    search,
    search_with_scores,
)
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
    assert search(db, q, 1)[0, 0] == 1 and search(db, q, 1, metric="ip")[0, 0] == 1
    scores, ids = search_with_scores(db, q, 2, metric="l2")
    assert ids.tolist() == [[0, 1]] and scores.tolist() == [[0.0, 4.0]]  # squared distances, ascending


@pytest.mark.parametrize("backend", ["faiss", "torch"])
def test_l2_search_is_the_brute_force_l2_ranking(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    db, queries = _data()
    if backend == "torch":
        monkeypatch.setattr(retrieval, "faiss", None)
    expected_ids, expected_dist = _brute_force_l2(db, queries, 10)
    scores, ids = search_with_scores(db, queries, 10, metric="l2")
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_allclose(scores, expected_dist, rtol=1e-4, atol=1e-3)
    ip = search(db, queries, 10)
    assert (ip[:, 0] != ids[:, 0]).mean() > 0.3  # not the inner-product ranking on these rows
    ip_expected = np.argsort(-(queries.astype(np.float64) @ db.T.astype(np.float64)), axis=1, kind="stable")[:, :10]
    np.testing.assert_array_equal(ip, ip_expected)  # the default still ranks by inner product


def test_l2_ties_are_ordered_by_index() -> None:
    db, queries = _data(n=20, q=3)
    db = np.concatenate([db, db])  # row i and i + 20 tie exactly
    ids = search(db, queries, 40, metric="l2")
    expected, _ = _brute_force_l2(db, queries, 40)
    np.testing.assert_array_equal(ids, expected)
    ids_k1 = search(db, queries, 1, metric="l2")  # the tie straddles k: the lower index wins
    np.testing.assert_array_equal(ids_k1[:, 0], expected[:, 0])


@pytest.mark.parametrize("store", REFINE_STORES)
def test_two_stage_l2_search_rescores_by_l2(store: str, tmp_path) -> None:
    db, queries = _data()
    path = tmp_path / "db.npy"
    np.save(path, db)
    stored = np.load(path, mmap_mode="r") if store == "disk" else db
    expected_ids, expected_dist = _brute_force_l2(db, queries, 5)
    # The shortlist holds every row: whatever PQ ranks, the exact second stage must give the L2 top-k.
    scores, ids = search_with_scores(stored, queries, 5, index="PQ2x4", refine=len(db), refine_store=store, metric="l2")
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_allclose(scores, expected_dist, rtol=1e-4, atol=1e-3)


def test_approximate_and_l2_only_types_build_for_l2_and_a_prebuilt_index_must_match() -> None:
    db, queries = _data()
    expected, _ = _brute_force_l2(db, queries, 5)
    # exhaustive search through an HNSW graph of 64 rows with a wide beam: the exact L2 top-5
    np.testing.assert_array_equal(search(db, queries, 5, index="HNSW8", search_params="efSearch=64", metric="l2"),
                                  expected)
    search(db, queries, 5, index="LSHrt", metric="l2")  # built for L2 only: fine for an L2 search
    with pytest.raises(ValueError, match="L2 metric only"):
        search(db, queries, 5, index="LSHrt")  # ... refused for inner product, as before
    flat_ip = build_index(db)
    with pytest.raises(ValueError, match="ranks by ip.*metric='l2'"):
        search(db, queries, 5, index=flat_ip, metric="l2")
    np.testing.assert_array_equal(search(db, queries, 5, index=build_index(db, metric="l2"), metric="l2"), expected)


def test_bad_metrics_and_superglobal_after_l2_are_config_errors() -> None:
    db, queries = _data(n=8, q=2)
    with pytest.raises(ConfigError, match="evaluation.metric='cosine'"):
        search(db, queries, 2, metric="cosine")
    with pytest.raises(ConfigError, match="superglobal.*metric=l2"):
        rerank_metric_check(SuperGlobalRerank(), "l2")
    rerank_metric_check(SuperGlobalRerank(), "ip")
    problems = evaluation_option_problems({"metric": "l2", "rerank": True, "index": "LSHrt"}, 8)
    assert len(problems) == 1 and "superglobal" in problems[0]  # LSHrt is fine for L2
    assert "cosine" in evaluation_option_problems({"metric": "cosine"}, 8)[0]


def test_the_protocol_carries_the_metric_of_the_weights() -> None:
    cfg = PretrainedCfg(architecture="gem_resnet50conv4", tag="x", eval_metric="l2", eval_whitening_kind="project")
    protocol = EvalProtocol.from_pretrained_cfg(cfg)
    assert (protocol.metric, protocol.whitening_kind) == ("l2", "project")
    assert protocol.overridden_by({"metric": "ip"}).metric == "ip"
    assert PretrainedCfg.from_json(cfg.to_dict()).eval_metric == "l2"  # a save_pretrained folder keeps it
    assert EvalProtocol.from_pretrained_cfg(PretrainedCfg()).metric == "ip"  # the default
    with pytest.raises(ConfigError, match="evaluation.metric"):
        protocol.overridden_by({"metric": "cos"})
