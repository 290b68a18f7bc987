"""Retrieval metrics as pure numpy functions of rankings and ground truth."""

from aggzoo.evaluation.metrics.revisited import average_precision, positive_ranks, precision_at_k, revisited_metrics

__all__ = ["average_precision", "positive_ranks", "precision_at_k", "revisited_metrics"]
