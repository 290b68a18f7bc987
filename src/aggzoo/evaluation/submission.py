"""MSLS challenge submission files (mapillary/mapillary_sls ``evaluate.py`` reads them with ``np.loadtxt``).

One line per query: the query image key, then the predicted database keys, best first, space-separated::

    AoD5-ZB5YrgyClbR5qmG4g AszgP_Xhs_cmcPHEoXv-Mw uwGs1pyo90OJi4hTLzGWfg ...

A key is the image file name without ``.jpg``. Lines starting with ``#`` are comments. The challenge
scores Recall@{1, 5, 10, 20} (and mAP@k), so write at least 20 predictions per query (default 25).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from aggzoo.data.retrieval_set import RetrievalSet

__all__ = ["write_msls_submission", "read_msls_submission"]


def write_msls_submission(
    retrieval_set: RetrievalSet, predictions: np.ndarray, path: str | Path, *, k: int = 25
) -> Path:
    """Write ``predictions [Q, >= k]`` (database indices, best first) as an MSLS prediction file."""
    predictions = np.asarray(predictions)
    if predictions.shape[0] != retrieval_set.num_queries:
        raise ValueError(f"{predictions.shape[0]} prediction rows for {retrieval_set.num_queries} queries")
    k = min(k, predictions.shape[1])
    db_keys = [p.stem for p in retrieval_set.database_paths]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        handle.write(f"# {retrieval_set.name}: query key, then the top-{k} database keys (aggzoo)\n")
        for query, row in zip(retrieval_set.query_paths, predictions[:, :k]):
            handle.write(" ".join([query.stem, *(db_keys[i] for i in row if i >= 0)]) + "\n")
    return path


def read_msls_submission(path: str | Path) -> dict[str, list[str]]:
    """``{query key: [database keys, best first]}`` from a prediction file."""
    out: dict[str, list[str]] = {}
    for line in Path(path).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            query, *ranked = line.split()
            out[query] = ranked
    return out
