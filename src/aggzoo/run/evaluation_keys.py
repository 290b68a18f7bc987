"""The flat ``evaluation.<key>`` overrides of earlier versions (``evaluation.index=...``, ``evaluation.rerank_k=...``),
moved to their sub-node of ``conf/eval.yaml`` (``evaluation.search.index=...``) with a warning that names the new key.

Imports nothing heavy: the console entry points rewrite their command line with it before Hydra parses it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["FLAT_KEYS", "migrate_overrides"]

#: ``evaluation.<old flat key>`` -> ``evaluation.<node>.<key>``
FLAT_KEYS = {
    "image_size": "protocol.image_size", "protocol_resize": "protocol.resize", "interpolation": "protocol.interpolation",
    "mean": "protocol.mean", "std": "protocol.std", "descriptor_dim": "protocol.descriptor_dim",
    "descriptor_dtype": "extraction.descriptor_dtype", "precision": "extraction.precision",
    "progress": "extraction.progress",
    "scales": "test_time.scales", "multiscale_reduce": "test_time.multiscale_reduce",
    "tlc_train_size": "test_time.tlc_train_size",
    "metric": "search.metric", "index": "search.index", "search_params": "search.search_params",
    "refine": "search.refine", "refine_store": "search.refine_store", "store_dir": "search.store_dir",
    "use_gpu": "search.use_gpu",
    "whitening": "postprocess.whitening", "whitening_fit": "postprocess.whitening_fit",
    "whitening_dim": "postprocess.whitening_dim", "whitening_kind": "postprocess.whitening_kind",
    "rerank": "rerank.method", "rerank_k": "rerank.k", "tokens": "rerank.tokens",
    "pictures": "outputs.pictures", "grid_queries": "outputs.grid_queries", "grid_k": "outputs.grid_k",
    "save_predictions": "outputs.save_predictions", "save_descriptors": "outputs.save_descriptors",
    "write_submissions": "outputs.write_submissions",
}


def migrate_overrides(overrides: Sequence[str]) -> list[str]:
    """A command line's overrides with every flat ``evaluation.<key>`` of :data:`FLAT_KEYS` moved to its node
    (``evaluation.index=HNSW32`` -> ``evaluation.search.index=HNSW32``), each move warned about once."""
    out = []
    for override in overrides:
        prefix = override[: len(override) - len(override.lstrip("+~"))]
        key, sep, value = override[len(prefix):].partition("=")
        old = key.strip()
        if old.startswith("evaluation.") and old.count(".") == 1 and old.split(".", 1)[1] in FLAT_KEYS:
            new = "evaluation." + FLAT_KEYS[old.split(".", 1)[1]]
            message = f"{old} is now {new}; the flat key will go in a later version: write {new}={value}"
            print(f"warning: {message}", file=sys.stderr)
            override = f"{prefix.lstrip('+')}{new}{sep}{value}"
        out.append(override)
    return out
