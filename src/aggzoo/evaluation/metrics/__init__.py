"""Retrieval metrics, one module per community's protocol: Recall@k (place recognition, :mod:`.recall`), mAP and
mP@k of the revisited Oxford/Paris protocol (:mod:`.revisited`)."""

from aggzoo.evaluation.metrics.recall import first_correct_rank, ks_beyond_database, recall_at_k, recall_curve

__all__ = ["first_correct_rank", "ks_beyond_database", "recall_at_k", "recall_curve"]
