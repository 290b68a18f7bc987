"""One benchmark's evaluation as data: :class:`RetrievalResult`, and the metrics of a ranking
(:func:`result_from_predictions`), whichever ones the benchmark's community reports."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from aggzoo.data.retrieval_set import RetrievalSet
from aggzoo.evaluation.metrics.recall import recall_at_k, recall_curve
from aggzoo.evaluation.options import DEFAULT_KS

__all__ = ["RetrievalResult", "result_from_predictions"]


@dataclass
class RetrievalResult:
    """One benchmark's evaluation.

    Attributes:
        recalls: ``{k: Recall@k}`` as fractions in [0, 1].
        metrics: the benchmark's other metrics by name (the revisited protocol's ``"medium/mAP"``,
            ``"hard/mP@10"``...), fractions in [0, 1]; empty for a place-recognition benchmark.
        predictions: ``[Q, K]`` ranked database indices (``K = max(ks)``, a metric's depth, or the database size).
        curve: Recall@k for every ``k = 1..K``.
        retrieval_set: the evaluated set (paths and ground truth), for pictures and submissions.
        database_descriptors, query_descriptors: ``[N_db, D]``, ``[Q, D]`` when asked to keep them.
    """

    name: str
    recalls: dict[int, float]
    num_queries: int
    num_database: int
    queries_without_positive: int
    predictions: np.ndarray
    curve: np.ndarray
    descriptor_dim: int = 0
    extraction_seconds: float = 0.0
    search_seconds: float = 0.0
    retrieval_set: RetrievalSet | None = field(default=None, repr=False)
    database_descriptors: np.ndarray | None = field(default=None, repr=False)
    query_descriptors: np.ndarray | None = field(default=None, repr=False)
    extras: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def reports_recall(self) -> bool:
        """Whether the benchmark's community reports Recall@k (a place-recognition benchmark)."""
        names = getattr(self.retrieval_set, "metrics", ("recall",)) if self.retrieval_set is not None else ("recall",)
        return "recall" in names or not self.metrics

    def summary(self) -> dict[str, Any]:
        """JSON-ready fields (no arrays except the short curve)."""
        return {
            "name": self.name,
            "recalls": {str(k): v for k, v in self.recalls.items()},
            **({"metrics": dict(self.metrics)} if self.metrics else {}),
            "num_queries": self.num_queries,
            "num_database": self.num_database,
            "queries_without_positive": self.queries_without_positive,
            "descriptor_dim": self.descriptor_dim,
            "extraction_seconds": round(self.extraction_seconds, 3),
            "search_seconds": round(self.search_seconds, 3),
            "curve": [float(v) for v in self.curve],
            **self.extras,
        }


def result_from_predictions(
    retrieval_set: RetrievalSet, predictions: np.ndarray, ks: Sequence[int] = DEFAULT_KS, **fields: Any
) -> RetrievalResult:
    """A :class:`RetrievalResult` from ranked ``[Q, K]`` predictions (computed here, elsewhere, or re-ranked):
    Recall@k, and the set's other metrics."""
    positives = retrieval_set.positives
    return RetrievalResult(
        name=retrieval_set.name,
        recalls=recall_at_k(predictions, positives, ks, num_database=retrieval_set.num_database),
        num_queries=retrieval_set.num_queries,
        num_database=retrieval_set.num_database,
        queries_without_positive=retrieval_set.queries_without_positive,
        predictions=predictions,
        curve=recall_curve(predictions, positives),
        retrieval_set=retrieval_set,
        **fields,
    )
