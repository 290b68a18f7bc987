"""Retrieval metrics, one module per community's protocol: Recall@k (place recognition, :mod:`.recall`), mAP and
mP@k of the revisited Oxford/Paris protocol (:mod:`.revisited`), MAP@R and R-Precision of metric learning
(:mod:`.map_at_r`)."""

from aggzoo.evaluation.metrics.map_at_r import hits_in_first_r, map_at_r_metrics
from aggzoo.evaluation.metrics.recall import first_correct_rank, ks_beyond_database, recall_at_k, recall_curve
from aggzoo.evaluation.metrics.revisited import average_precision, positive_ranks, precision_at_k, revisited_metrics

__all__ = ["average_precision", "first_correct_rank", "hits_in_first_r", "ks_beyond_database", "map_at_r_metrics",
           "positive_ranks", "precision_at_k", "recall_at_k", "recall_curve", "revisited_metrics"]
