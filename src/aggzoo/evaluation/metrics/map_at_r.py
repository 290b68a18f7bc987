"""MAP@R and R-Precision, the metric-learning metrics of Musgrave, Belongie and Lim, "A Metric Learning Reality
Check" (ECCV 2020, arXiv:2003.08505), section 3.2, as pytorch-metric-learning's ``AccuracyCalculator`` computes
them (``mean_average_precision_at_r``, ``r_precision``).

For a query with ``R`` positives (the database images of its class, itself excluded when it is in the
database) and its first ``R`` results:

- R-Precision = (number of positives among the first ``R``) / ``R``;
- MAP@R = (1 / R) * sum_{i=1..R} P(i), where P(i) = precision at ``i`` when the ``i``-th result is a positive and
  0 when it is not: average precision with the ranking cut at ``R`` and every positive counted in the
  denominator, so it is 1 only when the first ``R`` results are all positives.

Both average over the queries with at least one positive; the others are left out and counted
(``left_out``, pytorch-metric-learning's "lone queries"). A ranking shorter than ``R`` counts its missing
places as wrong (``incomplete`` counts such queries); ``-1`` entries (padding) are never positives.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["map_at_r_metrics", "hits_in_first_r"]


def hits_in_first_r(ranking: np.ndarray, positives: np.ndarray) -> np.ndarray:
    """``[R]`` booleans: whether each of the first ``R = len(positives)`` results of ``ranking`` is a positive
    (places beyond the ranking's end are ``False``)."""
    positives = np.unique(np.asarray(positives, dtype=np.int64))
    head = np.asarray(ranking, dtype=np.int64).reshape(-1)[: len(positives)]
    hits = np.zeros(len(positives), dtype=bool)
    hits[: len(head)] = np.isin(head, positives) & (head >= 0)
    return hits


def map_at_r_metrics(predictions: np.ndarray, positives: Sequence[np.ndarray]) -> dict[str, float | int]:
    """MAP@R and R-Precision over the queries of ``[Q, K]`` ranked ``predictions``.

    Args:
        predictions: ``[Q, K]`` database ids per query, best first (``-1``: padding).
        positives: per query, the database ids of its class (without the query itself).

    Returns:
        ``{"map_at_r", "r_precision"}`` as fractions in [0, 1] (NaN when no query has a positive), and the counts
        ``"queries"`` (with at least one positive), ``"left_out"`` (without) and ``"incomplete"`` (``K < R``).
    """
    predictions = np.asarray(predictions, dtype=np.int64)
    if predictions.ndim != 2 or len(predictions) != len(positives):
        raise ValueError(f"predictions must be [Q, K] with one row per positive list; got {predictions.shape} for "
                         f"{len(positives)} queries")
    average_precisions, r_precisions, incomplete = [], [], 0
    for ranking, rows in zip(predictions, positives):
        hits = hits_in_first_r(ranking, rows)
        r = len(hits)
        if r == 0:
            continue
        incomplete += int(predictions.shape[1] < r)
        precision_at_i = np.cumsum(hits) / np.arange(1, r + 1)
        average_precisions.append(float(np.sum(precision_at_i * hits) / r))
        r_precisions.append(float(np.count_nonzero(hits) / r))
    evaluated = len(average_precisions)
    return {
        "map_at_r": float(np.mean(average_precisions)) if evaluated else float("nan"),
        "r_precision": float(np.mean(r_precisions)) if evaluated else float("nan"),
        "queries": evaluated,
        "left_out": len(predictions) - evaluated,
        "incomplete": incomplete,
    }
