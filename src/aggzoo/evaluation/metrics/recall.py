"""Recall@k, the place-recognition metric: a query is correct at ``k`` when any of its first ``k`` results is a
positive, over *all* queries (a query without any positive is a miss), as every published VPR number counts it
(gmberton/VPR-methods-evaluation, gsv-cities, SALAD, BoQ).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from aggzoo.evaluation.options import DEFAULT_KS

__all__ = ["first_correct_rank", "ks_beyond_database", "recall_at_k", "recall_curve"]


def first_correct_rank(predictions: np.ndarray, positives: Sequence[np.ndarray]) -> np.ndarray:
    """Per query, the 0-based rank of the first positive among ``predictions``, or ``-1``."""
    predictions = np.asarray(predictions)
    if predictions.ndim != 2 or len(predictions) != len(positives):
        raise ValueError(
            f"predictions must be [Q, k] with one row per positive list; got {predictions.shape} "
            f"for {len(positives)} queries"
        )
    ranks = np.full(len(predictions), -1, dtype=np.int64)
    for q, (row, pos) in enumerate(zip(predictions, positives)):
        hits = np.flatnonzero(np.isin(row, pos))
        if hits.size:
            ranks[q] = hits[0]
    return ranks


def recall_curve(predictions: np.ndarray, positives: Sequence[np.ndarray]) -> np.ndarray:
    """Recall@k for every ``k = 1 .. predictions.shape[1]`` (``curve[k - 1]``), over all queries."""
    ranks = first_correct_rank(predictions, positives)
    width = np.asarray(predictions).shape[1]
    counts = np.bincount(ranks[ranks >= 0], minlength=width)
    return np.cumsum(counts) / max(len(ranks), 1)


def ks_beyond_database(ks: Iterable[int], num_database: int) -> list[int]:
    """The cut-offs of ``ks`` above the database size. The one rule for them, everywhere Recall@k is
    computed (test, ``eval.py``, validation): ``k >= 1`` is required (the config check refuses less), and
    a ``k`` above the database size is reported as Recall@N_db (the whole database is retrieved), with a
    note under the results table that names these ``k``."""
    return sorted(int(k) for k in ks if int(k) > num_database)


def recall_at_k(
    predictions: np.ndarray,
    positives: Sequence[np.ndarray],
    ks: Sequence[int] = DEFAULT_KS,
    *,
    num_database: int | None = None,
) -> dict[int, float]:
    """Recall@k: fraction of all queries with a positive among their first ``k`` predictions.

    Args:
        predictions: ``[Q, K]`` ranked database indices.
        positives: per query, the database indices that count as correct (may be empty: a miss).
        ks: cut-offs; each must be ``<= K`` unless the predictions rank the whole database
            (``num_database == K``), where any larger ``k`` equals Recall@K.
    """
    width = np.asarray(predictions).shape[1]
    for k in ks:
        if k < 1 or (k > width and num_database != width):
            raise ValueError(
                f"Recall@{k} needs at least {k} predictions per query, got {width}; search with k >= {max(ks)}"
            )
    curve = recall_curve(predictions, positives)
    return {int(k): float(curve[min(k, width) - 1]) for k in ks}

