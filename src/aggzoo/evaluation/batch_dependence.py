"""Descriptors that depend on the batch: say so, and record the protocol that produced them.

CricaVPR's and SuperVLAD's cross-image encoders attend across the images of a batch, so an image's
descriptor changes with the images it is extracted with (Lu-Feng/CricaVPR issue 7: shuffled test
batches take Pitts30k R@1 from 94.8 to about 92). A head declares this with
:attr:`aggzoo.models.heads.base.Head.batch_dependent`. Extraction
(:func:`aggzoo.evaluation.extraction.extract_descriptors`) always runs in file order, database and
queries apart (as the authors' test scripts do), so the result is reproducible for one batch size;
this module names the heads, warns once per evaluation, and gives the fields a result records.
"""

from __future__ import annotations

import logging
from typing import Any

from torch import nn

from aggzoo.models.heads.base import Head

__all__ = ["batch_dependent_heads", "batch_dependence_record"]

log = logging.getLogger(__name__)


def batch_dependent_heads(model: nn.Module) -> list[str]:
    """Names (``type(head).__name__``) of the heads inside ``model`` that declare ``batch_dependent``."""
    return [type(m).__name__ for m in model.modules() if isinstance(m, Head) and m.batch_dependent]


def batch_dependence_record(model: nn.Module, batch_size: int, *, name: str = "") -> dict[str, Any]:
    """``{}`` for a batch-independent model; otherwise warn and return the ``batch_dependent`` entry
    a :class:`~aggzoo.evaluation.result.RetrievalResult` stores in its ``extras`` (and its JSON)."""
    heads = batch_dependent_heads(model)
    if not heads:
        return {}
    log.warning(
        "%s%s is batch-dependent (its descriptors attend across the images of a batch): results hold for "
        "batch size %d with images in file order, database and queries in separate batches; another "
        "eval_batch_size, order or split gives other descriptors.", f"{name}: " if name else "",
        " and ".join(sorted(set(heads))), batch_size)
    return {"batch_dependent": {"heads": sorted(set(heads)), "batch_size": int(batch_size),
                                "order": "file order, database and queries in separate batches"}}
