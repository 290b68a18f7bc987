"""mAP and mP@k of the revisited Oxford / Paris protocol (Radenović et al., CVPR 2018), as
filipradenovic/revisitop's ``python/evaluate.py`` (``compute_ap``, ``compute_map``) defines them.

Per query, the ranking is scored after its *junk* is removed: a positive's rank is its position among
the non-junk results (zero-based). With ``n`` positives and the retrieved positives at ranks
``r_0 < r_1 < ...``:

- AP = sum_j (P_before_j + P_after_j) / (2 n), with P_before_j = j / r_j (1 when r_j = 0) and
  P_after_j = (j + 1) / (r_j + 1): the trapezoidal area under the precision-recall curve.
- P@k = #{positives with rank < k_q} / k_q, k_q = min(r_last + 1, k): precision at k, but at most up
  to the last positive, so a query with fewer than k positives can still score 1.

mAP and mP@k average over the queries that have at least one positive; the others are left out and
counted (``left_out``).

What revisitop does not define, because it always scores the full ranking of the database:

- A truncated ranking (the top K of a search): positives not in it contribute nothing to AP (a lower
  bound of the full-ranking AP), and for P@k they count as ranked beyond the end, so k_q = k; P@k is
  exact whenever every positive is retrieved or the ranking keeps at least k non-junk results.
  ``incomplete`` counts the queries whose ranking missed a positive.
- No positive retrieved at all: AP = 0 and P@k = 0.
- ``-1`` entries (the padding of an approximate search that found fewer than K) are dropped, and an
  id repeated in a ranking counts once, at its first position.
- An id listed both as a positive and as junk counts as a positive.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from aggzoo.data.retrieval_set import GroundTruth

__all__ = ["average_precision", "precision_at_k", "positive_ranks", "revisited_metrics"]

_EMPTY = np.empty(0, dtype=np.int64)
_POSITIVE, _JUNK = 1, 2


def _clean(ranking: np.ndarray) -> np.ndarray:
    """``ranking`` without padding (``-1``) and with each id at its first position only."""
    ranking = np.asarray(ranking, dtype=np.int64).reshape(-1)
    ranking = ranking[ranking >= 0]
    if len(ranking) and np.bincount(ranking).max() > 1:  # O(K); the sort below only when ids repeat
        _, first = np.unique(ranking, return_index=True)
        ranking = ranking[np.sort(first)]
    return ranking


def _ranks(clean: np.ndarray, positives: np.ndarray, junk: np.ndarray) -> np.ndarray:
    """Zero-based ranks of the positives in the cleaned ranking once junk is taken out, ascending.

    One lookup table over the database ids: linear in K, so a full ranking of R1M costs milliseconds.
    """
    if (positives < 0).any() or (junk < 0).any():
        raise ValueError("ground truth lists a negative database id")
    size = 1 + max(clean.max(initial=-1), positives.max(initial=-1), junk.max(initial=-1))
    label = np.zeros(size, dtype=np.int8)
    label[junk] = _JUNK
    label[positives] = _POSITIVE  # an id listed as both counts as a positive
    labels = label[clean]
    return np.flatnonzero(labels[labels != _JUNK] == _POSITIVE)


def positive_ranks(ranking: np.ndarray, positives: np.ndarray, junk: np.ndarray | None = None) -> np.ndarray:
    """Zero-based ranks of the retrieved positives in ``ranking`` once junk is removed, ascending.

    Args:
        ranking: ``[K]`` database ids, best first; ``-1`` entries are padding and dropped.
        positives: ``[P]`` database ids that are correct.
        junk: ``[J]`` database ids removed from the ranking before it is scored.
    """
    positives = np.asarray(positives, dtype=np.int64).reshape(-1)
    junk = _EMPTY if junk is None else np.asarray(junk, dtype=np.int64).reshape(-1)
    return _ranks(_clean(ranking), positives, junk)


def _ap_from_ranks(ranks: np.ndarray, num_positives: int) -> float:
    found = np.arange(len(ranks), dtype=np.float64)
    before = np.divide(found, ranks, out=np.ones_like(found), where=ranks > 0)
    after = (found + 1.0) / (ranks + 1.0)
    return float(np.sum(before + after) / (2.0 * num_positives))


def _precision_from_ranks(ranks: np.ndarray, num_positives: int, k: int) -> float:
    if len(ranks) == 0:
        return 0.0
    # Positives missing from a truncated ranking lie beyond its end, hence beyond any k_q < k.
    k_q = min(int(ranks[-1]) + 1, k) if len(ranks) == num_positives else k
    return float(np.count_nonzero(ranks < k_q) / k_q)


def average_precision(ranking: np.ndarray, positives: np.ndarray, junk: np.ndarray | None = None) -> float:
    """revisitop's AP of one query: ``ranking [K]`` ids best first, ``positives [P]``, ``junk [J]``.

    NaN when ``positives`` is empty (such a query is left out of the mean).
    """
    positives = np.unique(np.asarray(positives, dtype=np.int64))
    if len(positives) == 0:
        return float("nan")
    return _ap_from_ranks(positive_ranks(ranking, positives, junk), len(positives))


def precision_at_k(ranking: np.ndarray, positives: np.ndarray, junk: np.ndarray | None = None, *, k: int) -> float:
    """revisitop's P@k of one query: ``#{positives ranked < k_q} / k_q``, ``k_q = min(last positive's
    rank + 1, k)`` after junk removal. NaN when ``positives`` is empty."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    positives = np.unique(np.asarray(positives, dtype=np.int64))
    if len(positives) == 0:
        return float("nan")
    return _precision_from_ranks(positive_ranks(ranking, positives, junk), len(positives), k)


def revisited_metrics(
    predictions: np.ndarray, setups: Mapping[str, GroundTruth], ks: Sequence[int] = (1, 5, 10)
) -> dict[str, dict[str, float | int]]:
    """mAP and mP@k per setup (revisitop: easy, medium, hard).

    Args:
        predictions: ``[Q, K]`` database ids per query, best first (``-1``: padding).
        setups: setup name -> ground truth over the same ``Q`` queries.
        ks: the k of mP@k (revisitop reports 1, 5, 10).

    Returns:
        ``{setup: {"map": float, "mp@<k>": float, ..., "queries": int, "left_out": int,
        "incomplete": int}}``: fractions in ``[0, 1]`` averaged over the ``queries`` with at least one
        positive; ``left_out`` queries have none; ``incomplete`` is how many of the ``queries`` had a
        positive missing from the ranking (their AP is a lower bound). A setup where every query is
        left out has NaN scores.
    """
    predictions = np.asarray(predictions, dtype=np.int64)
    if predictions.ndim != 2:
        raise ValueError(f"predictions must be [Q, K], got shape {predictions.shape}")
    ks = tuple(int(k) for k in ks)
    if any(k < 1 for k in ks):
        raise ValueError(f"every k must be >= 1, got {ks}")
    for setup, truth in setups.items():
        if truth.num_queries != len(predictions):
            raise ValueError(f"setup {setup!r} has {truth.num_queries} queries but predictions has {len(predictions)} rows")
    aps: dict[str, list[float]] = {setup: [] for setup in setups}
    precisions: dict[str, list[list[float]]] = {setup: [] for setup in setups}
    incomplete = dict.fromkeys(setups, 0)
    for q, ranking in enumerate(predictions):
        clean = _clean(ranking)  # once per query, shared by the setups
        for setup, truth in setups.items():
            positives = np.unique(np.asarray(truth.positives[q], dtype=np.int64))
            if len(positives) == 0:
                continue
            junk = _EMPTY if truth.junk is None else np.asarray(truth.junk[q], dtype=np.int64).reshape(-1)
            ranks = _ranks(clean, positives, junk)
            incomplete[setup] += int(len(ranks) < len(positives))
            aps[setup].append(_ap_from_ranks(ranks, len(positives)))
            precisions[setup].append([_precision_from_ranks(ranks, len(positives), k) for k in ks])
    results: dict[str, dict[str, float | int]] = {}
    for setup in setups:
        evaluated = len(aps[setup])
        means = np.mean(precisions[setup], axis=0) if evaluated else np.full(len(ks), np.nan)
        results[setup] = {
            "map": float(np.mean(aps[setup])) if evaluated else float("nan"),
            **{f"mp@{k}": float(m) for k, m in zip(ks, means)},
            "queries": evaluated,
            "left_out": len(predictions) - evaluated,
            "incomplete": incomplete[setup],
        }
    return results
