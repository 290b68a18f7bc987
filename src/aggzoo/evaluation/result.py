"""One benchmark's evaluation as data: :class:`RetrievalResult`, and the metrics of a ranking
(:func:`result_from_predictions`), whichever ones the benchmark's community reports."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from aggzoo.data.retrieval_set import GroundTruth, RetrievalSet
from aggzoo.evaluation.metrics.map_at_r import map_at_r_metrics
from aggzoo.evaluation.metrics.recall import recall_at_k, recall_curve
from aggzoo.evaluation.metrics.revisited import revisited_metrics
from aggzoo.evaluation.options import DEFAULT_KS

__all__ = ["AT_R_METRICS", "MP_KS", "RANKING_METRICS", "RetrievalResult", "at_r_depth", "benchmark_metrics",
           "result_from_predictions"]

#: the k of mP@k the revisited protocol reports
MP_KS = (1, 5, 10)
#: metric names (``RetrievalSet.metrics``) scored on the whole ranking, so the search returns every database image
RANKING_METRICS = ("map", "mp")
#: metric names scored on each query's first R results (R = its number of positives): the metric-learning metrics,
#: reported under these column names
AT_R_METRICS = {"map_at_r": "MAP@R", "r_precision": "R-Precision"}


@dataclass
class RetrievalResult:
    """One benchmark's evaluation.

    Attributes:
        recalls: ``{k: Recall@k}`` as fractions in [0, 1].
        metrics: the benchmark's other metrics by name (the revisited protocol's ``"medium/mAP"``,
            ``"hard/mP@10"``...; metric learning's ``"all/MAP@R"``, ``"all/R-Precision"``), fractions in [0, 1];
            empty for a place-recognition benchmark.
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
        return self.retrieval_set is None or "recall" in self.retrieval_set.metrics

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


def at_r_depth(retrieval_set: RetrievalSet) -> int:
    """How many results per query MAP@R / R-Precision score, when the set reports them: the largest number of
    positives of a query (capped at the candidates); else 0."""
    if not set(retrieval_set.metrics) & set(AT_R_METRICS):
        return 0
    return min(max((len(p) for p in retrieval_set.positives), default=0), retrieval_set.num_candidates)


def benchmark_metrics(retrieval_set: RetrievalSet, predictions: np.ndarray) -> tuple[dict[str, float], dict[str, Any]]:
    """The metrics ``retrieval_set.metrics`` names besides Recall@k, on ``[Q, K]`` ranked predictions, as
    ``({"<setup>/<metric>": fraction}, {"<setup>": {"queries", "left_out", "incomplete"}})``: the revisited
    protocol's ``mAP`` and ``mP@<k>`` per ground-truth setup (easy / medium / hard; one setup ``all`` when the set
    has none), and the metric-learning ``MAP@R`` and ``R-Precision`` under the setup ``all``."""
    metrics: dict[str, float] = {}
    counts: dict[str, Any] = {}
    if set(retrieval_set.metrics) & set(RANKING_METRICS):
        setups = retrieval_set.setups or {"all": GroundTruth(retrieval_set.positives, retrieval_set.junk)}
        scored = revisited_metrics(predictions, setups, MP_KS)
        for setup, values in scored.items():
            if "map" in retrieval_set.metrics:
                metrics[f"{setup}/mAP"] = float(values["map"])
            if "mp" in retrieval_set.metrics:
                metrics.update({f"{setup}/mP@{k}": float(values[f"mp@{k}"]) for k in MP_KS})
            counts[setup] = {key: int(values[key]) for key in ("queries", "left_out", "incomplete")}
    if set(retrieval_set.metrics) & set(AT_R_METRICS):
        values = map_at_r_metrics(predictions, retrieval_set.positives)
        metrics.update({f"all/{column}": float(values[name]) for name, column in AT_R_METRICS.items()
                        if name in retrieval_set.metrics})
        counts["all"] = {key: int(values[key]) for key in ("queries", "left_out", "incomplete")}
    return metrics, counts


def result_from_predictions(
    retrieval_set: RetrievalSet, predictions: np.ndarray, ks: Sequence[int] = DEFAULT_KS, **fields: Any
) -> RetrievalResult:
    """A :class:`RetrievalResult` from ranked ``[Q, K]`` predictions (computed here, elsewhere, or re-ranked):
    Recall@k, and the set's other metrics (:func:`benchmark_metrics`; their query counts in ``extras``)."""
    positives = retrieval_set.positives
    metrics, counts = benchmark_metrics(retrieval_set, predictions)
    if counts:
        fields["extras"] = {**fields.get("extras", {}), "metric_queries": counts}
    return RetrievalResult(
        name=retrieval_set.name,
        recalls=recall_at_k(predictions, positives, ks, num_database=retrieval_set.num_candidates),
        num_queries=retrieval_set.num_queries,
        num_database=retrieval_set.num_database,
        queries_without_positive=retrieval_set.queries_without_positive,
        predictions=predictions,
        curve=recall_curve(predictions, positives),
        retrieval_set=retrieval_set,
        metrics=metrics,
        **fields,
    )
