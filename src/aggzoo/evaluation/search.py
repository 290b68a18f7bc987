"""Top-k search of a database of descriptors: FAISS when installed (any index of :mod:`aggzoo.evaluation.index`),
else exact search in torch.

The protocol every published VPR number follows (gmberton/VPR-methods-evaluation, gsv-cities, SALAD, BoQ):
exhaustive inner-product (= cosine on L2-normalised descriptors) or L2 search of the database for each query.
Ties in the similarity are broken by the lower database index, so the flat FAISS index (CPU or GPU) and the
torch fallback return the same ranking.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from aggzoo.evaluation.index import TwoStageIndex, as_float32, build_index, faiss, is_binary_index, metric_of, row_chunks
from aggzoo.evaluation.options import SearchOptions, check_metric

__all__ = ["search", "search_with_scores", "search_without_self", "without_rows"]


_EXACT_INDEX_TYPES = {"IndexFlat", "IndexFlatIP", "IndexFlatL2", "GpuIndexFlat", "GpuIndexFlatIP", "GpuIndexFlatL2"}


def _is_exact(index: Any) -> bool:
    """Exhaustive search (so ties past the k-th result can be ordered by index)?"""
    if isinstance(index, str):
        return index.replace(" ", "") in ("Flat", "SQfp16")
    if isinstance(index, TwoStageIndex):
        return False
    return type(faiss.downcast_index(index)).__name__ in _EXACT_INDEX_TYPES


def _torch_search(database: np.ndarray, queries: np.ndarray, k: int, metric: str = "ip") -> tuple[np.ndarray, np.ndarray]:
    """Scores higher-better (``metric="l2"``: negated squared distances)."""
    db = torch.from_numpy(as_float32(database))
    db_sq = (db * db).sum(1) if metric == "l2" else None
    all_scores, all_ids = [], []
    for part in row_chunks(len(queries), 1024):
        q = torch.from_numpy(as_float32(queries[part]))
        sims = q @ db.T
        if db_sq is not None:
            sims = 2 * sims - (q * q).sum(1, keepdim=True) - db_sq
        scores, ids = torch.topk(sims, k, dim=1)
        all_scores.append(scores.numpy())
        all_ids.append(ids.numpy())
    return np.concatenate(all_scores), np.concatenate(all_ids).astype(np.int64)


def _order_ties_by_index(
    scores: np.ndarray, ids: np.ndarray, k: int, database: np.ndarray, queries: np.ndarray, exact: bool,
    metric: str = "ip",
) -> tuple[np.ndarray, np.ndarray]:
    """Keep the best ``k`` of ``k' >= k`` candidates (``scores`` higher-better), equal scores ordered by
    database index.

    For exact search, a query whose tie group may continue past the ``k'`` candidates (its last
    candidate scores the same as its ``k``-th) is re-ranked against the whole database.
    """
    ids = np.where(ids < 0, np.iinfo(np.int64).max, ids)  # faiss pads with -1: rank those last
    scores = np.where(ids == np.iinfo(np.int64).max, -np.inf, scores)
    order = np.lexsort((ids, -scores), axis=1)
    scores = np.take_along_axis(scores, order, axis=1)
    ids = np.take_along_axis(ids, order, axis=1)
    if exact and scores.shape[1] > k and scores.shape[1] < len(database):
        ragged = np.flatnonzero(scores[:, k - 1] == scores[:, -1])
        db32 = as_float32(database) if ragged.size else None
        db_sq = np.einsum("nd,nd->n", db32, db32) if ragged.size and metric == "l2" else None
        for q in ragged:
            query = as_float32(queries[q])
            row = db32 @ query
            if db_sq is not None:  # negated squared distance, higher-better like the inner product
                row = 2 * row - np.dot(query, query) - db_sq
            full = np.lexsort((np.arange(len(row)), -row))[:k]
            ids[q, :k], scores[q, :k] = full, row[full]
    ids = ids[:, :k].copy()
    ids[ids == np.iinfo(np.int64).max] = -1
    return scores[:, :k].copy(), ids




def search_with_scores(
    database: np.ndarray,
    queries: np.ndarray,
    k: int,
    options: SearchOptions = SearchOptions(),
    *,
    prebuilt: Any = None,
    codes: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`search` that also returns the ``[Q, k]`` scores of the results: inner products
    (``metric="ip"``, descending) or squared L2 distances (``metric="l2"``, ascending), as FAISS returns
    them; ``-1`` pads score ``-inf`` (ip) or ``inf`` (l2)."""
    metric = check_metric(options.metric)
    database, queries = np.asarray(database), np.asarray(queries)
    if database.ndim != 2 or queries.ndim != 2 or database.shape[1] != queries.shape[1]:
        raise ValueError(f"database [N, D] and queries [Q, D] must share D; got {database.shape} and {queries.shape}")
    if not 1 <= k <= len(database):
        raise ValueError(f"k must be in [1, {len(database)}] (the database size), got {k}")
    exact = (_is_exact(prebuilt) if prebuilt is not None
             else _is_exact(options.index) and options.refine is None) and codes is None
    # A few extra candidates let ties straddling the k-th place be ordered by index.
    k_search = min(len(database), k + 8) if exact else k
    if faiss is not None:
        built = prebuilt if prebuilt is not None else build_index(
            database, options, codes=None if codes is None else codes[0])
        if built.ntotal != len(database):
            raise ValueError(f"the prebuilt index holds {built.ntotal} vectors, the database {len(database)}")
        if metric_of(built) != metric:
            raise ValueError(f"the prebuilt index ranks by {metric_of(built)}, the search asks metric={metric!r}; "
                             f"build it with SearchOptions(metric={metric!r})")
        if isinstance(built, TwoStageIndex) and built.binary:
            scores, ids = built.search(queries, k_search, first_queries=None if codes is None else codes[1])
        else:
            scores, ids = built.search(as_float32(queries), k_search)
        ids = ids.astype(np.int64, copy=False)
        if metric == "l2":
            scores = -scores  # higher-better, as inner products, for the tie ordering
    elif exact:
        scores, ids = _torch_search(database, queries, k_search, metric)
    elif codes is not None or is_binary_index(options.index):
        raise ImportError(f"the binary first stage {options.index!r} needs faiss: pip install 'aggzoo[cpu]' (or [gpu])")
    else:
        raise ImportError(f"index {options.index!r} needs faiss: pip install 'aggzoo[cpu]' (or [gpu])")
    scores, ids = _order_ties_by_index(scores, ids, k, database, queries, exact, metric)
    return (-scores if metric == "l2" else scores), ids


def search(
    database: np.ndarray,
    queries: np.ndarray,
    k: int,
    options: SearchOptions = SearchOptions(),
    *,
    prebuilt: Any = None,
    codes: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """Top-``k`` database rows for each query by inner product (or L2 distance), best first.

    Args:
        database: ``[N, D]`` descriptors (float32 or float16), L2-normalised for cosine ranking.
        queries: ``[Q, D]``.
        k: results per query, ``1 <= k <= N``.
        options: the index type (``"Flat"``, the default, is exact; ``"SQfp16"`` stores float16; approximate
            ones for large databases: ``"HNSW32"``, ``"IVF1024,PQ64"``...), its search parameters, the metric,
            and a two-stage search (``refine``: the exact top-``k`` of the first stage's shortlist of ``M``,
            re-scored against the descriptors in RAM or, ``refine_store="disk"``, ``database`` itself, e.g. an
            ``np.memmap``: RAM holds only the codes). See :class:`~aggzoo.evaluation.options.SearchOptions`.
        prebuilt: an index from :func:`~aggzoo.evaluation.index.build_index` holding ``database`` (built once,
            searched many times); ``options.index`` is then not built again.
        codes: ``(database codes, query codes)``, packed (:func:`~aggzoo.evaluation.binary_codes.pack_codes`),
            for a binary first stage (``options.index`` a FAISS binary index such as ``"BFlat"``), whose
            Hamming top-``refine`` is re-scored against ``database``.

    Returns:
        ``[Q, k]`` ``int64`` database indices, most similar first; equal similarities in index order
        (approximate indexes may pad with ``-1`` when they find fewer than ``k``).

    Without FAISS installed, exact search runs in torch (queries in blocks of 1024).
    """
    return search_with_scores(database, queries, k, options, prebuilt=prebuilt, codes=codes)[1]


def without_rows(scores: np.ndarray, indices: np.ndarray, own: Sequence[np.ndarray], k: int,
                 pad_score: float) -> tuple[np.ndarray, np.ndarray]:
    """``[Q, k' >= k]`` results -> ``[Q, k]`` without each query's ``own`` database rows (``-1`` pads, scored
    ``pad_score``)."""
    out_scores = np.full((indices.shape[0], k), pad_score, dtype=scores.dtype)
    out_indices = np.full((indices.shape[0], k), -1, dtype=indices.dtype)
    for q, rows in enumerate(own):
        keep = ~np.isin(indices[q], rows) & (indices[q] >= 0)
        kept = np.flatnonzero(keep)[:k]
        out_indices[q, :kept.size] = indices[q, kept]
        out_scores[q, :kept.size] = scores[q, kept]
    return out_scores, out_indices


def search_without_self(
    database: np.ndarray,
    k: int,
    options: SearchOptions = SearchOptions(),
    *,
    codes: np.ndarray | None = None,
) -> np.ndarray:
    """Every database row as a query against all the others (the metric-learning protocol): ``[N, k]`` ids.

    The search returns ``k + 1`` results and each row's own index is removed from them, by index, not by score
    (a duplicate image scores as high as the query itself); a row whose own index is not among them (an
    approximate index, or more than ``k`` exact duplicates ranked before it by index) loses its last result.

    Args:
        database: ``[N, D]`` descriptors, ``N >= 2``.
        k: results per query, ``1 <= k <= N - 1``.
        options: as :func:`search`.
        codes: the database's packed binary codes, for a binary first stage (they are also the queries' codes).
    """
    n = len(database)
    if not 1 <= k <= n - 1:
        raise ValueError(f"k must be in [1, {n - 1}] (the database size without the query), got {k}")
    ids = search(database, database, k + 1, options, codes=None if codes is None else (codes, codes))
    own = ids == np.arange(n)[:, None]
    missing = ~own.any(axis=1)
    own[missing, -1] = True  # no own row among the results: drop the last one
    return ids[~own].reshape(n, k)
