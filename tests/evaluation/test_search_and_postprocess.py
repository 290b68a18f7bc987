"""Approximate indexes against exact search; PCA-whitening and SuperGlobal reranking against the math."""

from __future__ import annotations

import numpy as np
import pytest

from aggzoo.evaluation.index import build_index, faiss_available
from aggzoo.evaluation.metrics import recall_at_k
from aggzoo.evaluation.options import SearchOptions
from aggzoo.evaluation.postprocess import PCAWhitening, SuperGlobalRerank
from aggzoo.evaluation.search import search

pytestmark = pytest.mark.skipif(not faiss_available(), reason="faiss not installed")


def clustered_set(seed: int = 0, n: int = 3000, d: int = 32, n_q: int = 300):
    """Places in clusters (look-alike neighbourhoods); each query a noisy view of one database image."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(100, d))
    db = (centers[rng.integers(0, 100, n)] + 0.35 * rng.normal(size=(n, d))).astype(np.float32)
    db /= np.linalg.norm(db, axis=1, keepdims=True)
    source = rng.choice(n, n_q, replace=False)
    q = (db[source] + 0.08 * rng.normal(size=(n_q, d))).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    return db, q, [np.array([s]) for s in source]


# Stated tolerances: the largest drop of Recall@k (k = 1, 5, 10) from exact search, on this data.
APPROXIMATE = [
    ("HNSW32", "efSearch=64", 0.02),
    ("IVF32,Flat", "nprobe=8", 0.05),
    ("IVF32,PQ32x4", "nprobe=8", 0.15),   # 16-byte codes, 8x smaller than float32: coarse distances
]


@pytest.mark.parametrize(("index", "params", "tolerance"), APPROXIMATE, ids=[a[0] for a in APPROXIMATE])
def test_approximate_index_within_stated_recall(index, params, tolerance):
    db, q, positives = clustered_set()
    exact = recall_at_k(search(db, q, 10), positives, (1, 5, 10))
    approx = recall_at_k(search(db, q, 10, SearchOptions(index=index, search_params=params)), positives, (1, 5, 10))
    assert exact[1] > 0.9  # the data is not trivial to get wrong: exact search nearly solves it
    for k in (1, 5, 10):
        assert approx[k] >= exact[k] - tolerance, (index, k, approx, exact)


def test_float16_index_is_exact_up_to_rounding():
    db, q, positives = clustered_set(seed=1)
    half = recall_at_k(search(db.astype(np.float16), q, 10, SearchOptions(index="SQfp16")), positives, (1, 5, 10))
    assert half == pytest.approx(recall_at_k(search(db, q, 10), positives, (1, 5, 10)), abs=0.01)


# ------------------------------------------------------------------------------------------- whitening


def test_pca_whitening_whitens_the_training_set():
    rng = np.random.default_rng(0)
    mixing = rng.normal(size=(16, 16)) * np.linspace(3, 0.1, 16)     # anisotropic
    train = rng.normal(size=(4000, 16)) @ mixing + 5.0
    pca = PCAWhitening.fit(train, dim=8, eps=0.0)
    projected = (train - pca.mean) @ pca.projection                   # before the final L2
    np.testing.assert_allclose(np.cov(projected, rowvar=False, bias=True), np.eye(8), atol=1e-3)
    assert np.all(np.diff(pca.eigenvalues) <= 0)
    out = pca(train.astype(np.float32))
    assert out.shape == (4000, 8)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, rtol=1e-5)


def test_pca_without_whitening_is_a_rotation_and_round_trips(tmp_path):
    rng = np.random.default_rng(1)
    train = rng.normal(size=(500, 10)).astype(np.float32)
    pca = PCAWhitening.fit(train, whiten=False)                       # default: min(N - 1, D) axes
    assert pca.out_dim == 10
    full = PCAWhitening.fit(rng.normal(size=(50, 6)), dim=6, whiten=False)
    np.testing.assert_allclose(full.projection.T @ full.projection, np.eye(6), atol=1e-5)  # orthonormal axes
    loaded = PCAWhitening.load(pca.save(tmp_path / "w.npz"))
    np.testing.assert_array_equal(loaded(train), pca(train))
    with pytest.raises(ValueError, match="PCA dim"):
        PCAWhitening.fit(train, dim=11)


def test_whitening_can_fix_a_dominant_nuisance_direction():
    """One direction carries a large nuisance (e.g. illumination) shared by all images: whitening
    learned on training data suppresses it and recovers the place signal."""
    rng = np.random.default_rng(2)
    d = 32
    nuisance = rng.normal(size=d)
    nuisance /= np.linalg.norm(nuisance)

    def views(places, strength):
        return places + strength * rng.normal(size=(len(places), 1)) * nuisance + 0.05 * rng.normal(size=places.shape)

    train = views(rng.normal(size=(3000, d)) * 0.2, 3.0)
    places = rng.normal(size=(400, d)) * 0.2
    db, q = views(places, 3.0).astype(np.float32), views(places, 3.0).astype(np.float32)
    positives = [np.array([i]) for i in range(400)]
    norm = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    raw = recall_at_k(search(norm(db), norm(q), 1), positives, (1,))[1]
    pca = PCAWhitening.fit(train, dim=24)
    white = recall_at_k(search(pca(db), pca(q), 1), positives, (1,))[1]
    assert white > raw + 0.3


# ------------------------------------------------------------------------------------------- reranking


def superglobal_reference(db, q, ranked, m, k, beta):
    """Straight from the SuperGlobal equations, one query at a time, float64."""
    out = ranked.copy()
    for i in range(len(q)):
        cand = ranked[i, :m]
        x = db[cand].astype(np.float64)
        refined = np.empty_like(x)
        for a in range(m):
            sims = x @ x[a]
            nn = np.argsort(-sims, kind="stable")[:k + 1]
            w = np.concatenate([[1.0], beta * sims[nn[1:]]])
            refined[a] = (w[:, None] * x[nn]).sum(0) / w.sum()
        s1 = refined @ q[i]
        order = np.argsort(-s1, kind="stable")
        expanded = refined[order[:k + 1]].max(axis=0)
        final = (s1[order] + refined[order] @ expanded) / 2
        out[i, :m] = cand[order][np.argsort(-final, kind="stable")]
    return out


def test_superglobal_rerank_matches_reference():
    db, q, _ = clustered_set(seed=3, n=600, d=16, n_q=20)
    ranked = search(db, q, 60)
    got = SuperGlobalRerank(top_m=40, k=5, beta=0.15, query_chunk=7)(db, q, ranked)
    np.testing.assert_array_equal(got, superglobal_reference(db, q, ranked, 40, 5, 0.15))
    np.testing.assert_array_equal(got[:, 40:], ranked[:, 40:])        # past M: global order kept
    for row, before in zip(got, ranked):                               # a permutation of the same candidates
        assert sorted(row[:40]) == sorted(before[:40])


def test_superglobal_rerank_with_fewer_candidates_than_m():
    db, q, _ = clustered_set(seed=4, n=50, d=8, n_q=5)
    ranked = search(db, q, 50)
    got = SuperGlobalRerank()(db, q, ranked)                           # M = 400 > 50 database images
    np.testing.assert_array_equal(got, superglobal_reference(db, q, ranked, 50, 9, 0.15))


def test_prebuilt_index_gives_the_same_ranking():
    db, q, _ = clustered_set(seed=5, n=500, d=16, n_q=40)
    built = build_index(db)
    np.testing.assert_array_equal(search(db, q, 7, prebuilt=built), search(db, q, 7))
    with pytest.raises(ValueError, match="prebuilt index holds 500"):
        search(db[:100], q, 7, prebuilt=built)
