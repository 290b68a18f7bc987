"""Class-labelled images as a retrieval benchmark, the deep-metric-learning protocol.

Two shapes, as the metric-learning benchmarks are evaluated (Musgrave et al., "A Metric Learning Reality
Check", ECCV 2020, arXiv:2003.08505; pytorch-metric-learning's ``AccuracyCalculator``):

- one set (CUB-200-2011, Cars196, Stanford Online Products, a class folder): every image is a query
  against all the others, itself excluded (``RetrievalSet.queries_are_database``); its positives are the
  other images of its class;
- a query set against a gallery (In-shop): the positives of a query are the gallery images of its class.

The metrics reported are Recall@k (a query is right at ``k`` when one of its first ``k`` results has its
class), MAP@R and R-Precision (``R`` = the number of positives of the query).
"""

from __future__ import annotations

import numpy as np

from aggzoo.data.class_labelled import ClassLabelledImages
from aggzoo.data.retrieval_set import RetrievalSet

__all__ = ["CLASS_METRICS", "class_positives", "class_retrieval_set"]

#: the metrics a metric-learning benchmark reports (names of ``RetrievalSet.metrics``)
CLASS_METRICS = ("recall", "map_at_r", "r_precision")


def class_positives(query_labels: np.ndarray, database_labels: np.ndarray, *,
                    exclude_self: bool = False) -> tuple[np.ndarray, ...]:
    """Per query, the sorted ``int64`` database indices of its class (``exclude_self``: the query is database
    row ``q`` and is left out of its own positives).

    Args:
        query_labels: ``[Q]`` class ids.
        database_labels: ``[N]`` class ids (``exclude_self`` needs ``Q == N``: the same images).
    """
    query_labels, database_labels = np.asarray(query_labels), np.asarray(database_labels)
    if exclude_self and len(query_labels) != len(database_labels):
        raise ValueError(f"exclude_self needs the queries to be the database: {len(query_labels)} != "
                         f"{len(database_labels)}")
    order = np.argsort(database_labels, kind="stable")
    sorted_labels = database_labels[order]
    starts = np.searchsorted(sorted_labels, query_labels, side="left")
    ends = np.searchsorted(sorted_labels, query_labels, side="right")
    out = []
    for q, (start, end) in enumerate(zip(starts, ends)):
        rows = np.sort(order[start:end])
        out.append(rows[rows != q] if exclude_self else rows)
    return tuple(out)


def class_retrieval_set(
    database: ClassLabelledImages,
    queries: ClassLabelledImages | None = None,
    *,
    name: str | None = None,
    metrics: tuple[str, ...] = CLASS_METRICS,
) -> RetrievalSet:
    """A :class:`RetrievalSet` scored by class: ``queries`` against ``database`` (In-shop's query / gallery), or,
    without ``queries``, every database image against all the others, itself excluded.

    Args:
        database: the searched images and their classes.
        queries: the query images; ``None``: the database images themselves.
        name: the benchmark's name in reports (default ``database.name``).
        metrics: the names scored (:data:`CLASS_METRICS`: Recall@k, MAP@R, R-Precision).
    """
    self_search = queries is None
    query_set = database if queries is None else queries
    positives = class_positives(query_set.labels, database.labels, exclude_self=self_search)
    return RetrievalSet(name=name or database.name, database_paths=database.paths, query_paths=query_set.paths,
                        positives=positives, metrics=metrics, queries_are_database=self_search)
