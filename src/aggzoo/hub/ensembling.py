"""The weight-ensembling record of a checkpoint: where it is kept, what it must hold, and the mix.

WiSE-FT (Wortsman et al., "Robust fine-tuning of zero-shot models", CVPR 2022): a training run with
``callbacks.weight_ensembling.alpha < 1`` ships ``(1 - alpha) * start + alpha * trained``. The
callback that records ``start`` and ``alpha`` is training's
(:class:`aggzoo.training.weight_ensembling.WeightEnsembling`); this module is the part of the concept
that belongs to the checkpoint *format*, and it lives in the hub for two reasons:

- every reader that builds a model from a file applies the mix (the one reader's
  :meth:`~aggzoo.hub.checkpoint.CheckpointFile.state_dict`, and through it ``aggzoo.create_model``,
  ``eval.py ckpt_path=``, ``manifest add``), including readers that never import training (a user's
  ``import aggzoo`` loads neither Lightning nor :mod:`aggzoo.training`);
- the layers point down (``hub`` <- ... <- ``training``): the hub cannot import training, while the
  callback can import this module.

So the record's key, its validation and the mix have this one home; the callback only writes the record.
Pure torch, no file access.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from aggzoo.errors import CheckpointError
from aggzoo.hub.remap import is_state_dict, show_keys

__all__ = ["ENSEMBLING_KEY", "ensembled_state", "ensembling_record", "is_ensembling_alpha", "recorded_alpha"]

#: Where a training checkpoint keeps the weights its fine-tuning started from and the WiSE-FT
#: coefficient: ``{"alpha": float, "start": {model key: tensor}}``.
ENSEMBLING_KEY = "aggzoo_weight_ensembling"


def is_ensembling_alpha(value: Any) -> bool:
    """Whether ``value`` is a weight-ensembling coefficient: a number (not a bool) in ``[0, 1]``."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0.0 <= float(value) <= 1.0


def ensembling_record(contents: Any) -> Any:
    """The :data:`ENSEMBLING_KEY` record of a file's top-level contents, as stored (``None`` when none)."""
    return contents.get(ENSEMBLING_KEY) if isinstance(contents, Mapping) else None


def recorded_alpha(contents: Any) -> float | None:
    """The WiSE-FT coefficient a file's contents record, ``None`` when they record none."""
    record = ensembling_record(contents)
    return float(record["alpha"]) if isinstance(record, Mapping) and "alpha" in record else None


def ensembled_state(state: Mapping[str, Tensor], record: Any, *, where: str = "checkpoint") -> dict[str, Tensor]:
    """WiSE-FT weight-space ensembling: ``(1 - alpha) * start + alpha * state`` for every
    floating-point tensor of ``record["start"]``, the weights fine-tuning started from.

    Tensors the record does not hold, and integer ones (BatchNorm's ``num_batches_tracked``), stay as
    trained. ``alpha = 1`` is ``state``; ``alpha = 0`` is the start.

    Raises:
        CheckpointError: the record is not ``{"alpha": float in [0, 1], "start": {key: tensor}}``, or
            names a key the state lacks or a tensor of another shape.
    """
    if not isinstance(record, Mapping) or set(record) != {"alpha", "start"}:
        raise CheckpointError(f"{where}: its {ENSEMBLING_KEY!r} record must hold exactly 'alpha' and 'start'")
    alpha, start = record["alpha"], record["start"]
    if not is_ensembling_alpha(alpha):
        raise CheckpointError(f"{where}: weight-ensembling alpha must be a number in [0, 1], got {alpha!r}")
    if not is_state_dict(start):
        raise CheckpointError(f"{where}: its weight-ensembling 'start' must map parameter names to tensors")
    unknown = sorted(set(start) - set(state))
    if unknown:
        raise CheckpointError(f"{where}: weight-ensembling 'start' names keys the model lacks: {show_keys(unknown)}")
    out = dict(state)
    for key, begin in start.items():
        end = state[key]
        if begin.shape != end.shape:
            raise CheckpointError(f"{where}: weight-ensembling 'start' holds {key} of shape {tuple(begin.shape)}, "
                                  f"the model {tuple(end.shape)}")
        if end.is_floating_point():
            out[key] = torch.lerp(begin.to(end.dtype), end, float(alpha))
    return out
