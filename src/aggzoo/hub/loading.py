"""Putting a state dict into a model: strictly, with every missing, unexpected or misshaped key named.

Loading is strict by default (:class:`StateDictMismatchError` names the keys); a foreign checkpoint goes
through a *named* remapping function (declared in the method's ``aggzoo.zoo`` file) and is then loaded
just as strictly. The file is read by the one reader (:func:`aggzoo.hub.checkpoint.read_checkpoint`);
registered weights are found by :func:`aggzoo.hub.download.fetch_weights`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from aggzoo.errors import ConversionError, StateDictMismatchError
from aggzoo.hub.cfg import PretrainedCfg
from aggzoo.hub.checkpoint import read_checkpoint
from aggzoo.hub.download import fetch_weights

__all__ = ["LoadReport", "load_checkpoint", "load_into", "load_pretrained"]


@dataclass
class LoadReport:
    """What a load did. ``kept`` lists model keys the file did not hold and that kept their value
    on purpose (``contents="delta"``: the pretrained backbone's tensors; ``num_batches_tracked``
    counters older checkpoints lack)."""

    loaded: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    mismatched: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched)

    def describe(self, limit: int = 20) -> str:
        def show(items: list[Any]) -> str:
            text = ", ".join(str(i) for i in items[:limit])
            return text + (f", ... ({len(items) - limit} more)" if len(items) > limit else "")

        parts = []
        if self.missing:
            parts.append(f"missing keys (in the model, not in the checkpoint): {show(self.missing)}")
        if self.unexpected:
            parts.append(f"unexpected keys (in the checkpoint, not in the model): {show(self.unexpected)}")
        if self.mismatched:
            rows = [f"{k} checkpoint {tuple(a)} vs model {tuple(b)}" for k, a, b in self.mismatched]
            parts.append(f"shape mismatches: {show(rows)}")
        return "; ".join(parts) if parts else f"all {len(self.loaded)} tensors loaded"


_COUNTER = "num_batches_tracked"


def load_into(
    model: nn.Module,
    state: Mapping[str, Tensor],
    *,
    strict: bool = True,
    keep_missing_under: tuple[str, ...] = (),
    what: str = "checkpoint",
) -> LoadReport:
    """Copy ``state`` into ``model``, reporting keys by name.

    Args:
        strict: raise :class:`StateDictMismatchError` on any missing, unexpected or mismatched key.
        keep_missing_under: key prefixes whose absence from ``state`` is expected (they keep the
            model's current values, e.g. ``("backbone.",)`` for a delta checkpoint).
        what: the checkpoint's name for messages.

    A module with an ``adopt_state_shapes(state, prefix)`` method first reshapes what it can take at
    another shape (a DINOv2 backbone's position grid, :class:`~aggzoo.models.backbones.timm_backbone.TimmBackbone`),
    as ``load_state_dict``'s pre-hooks do.
    """
    for name, module in model.named_modules():
        adopt = getattr(module, "adopt_state_shapes", None)
        if callable(adopt):
            adopt(state, f"{name}." if name else "")
    own = model.state_dict()
    report = LoadReport()
    to_load: dict[str, Tensor] = {}
    for key, tensor in state.items():
        if key not in own:
            report.unexpected.append(key)
        elif tuple(own[key].shape) != tuple(tensor.shape):
            report.mismatched.append((key, tuple(tensor.shape), tuple(own[key].shape)))
        else:
            to_load[key] = tensor
    for key in own:
        if key in state:
            continue
        if key.endswith(_COUNTER) or key.startswith(keep_missing_under):
            report.kept.append(key)
        else:
            report.missing.append(key)
    if strict and not report.ok:
        raise StateDictMismatchError(f"cannot load {what} into {type(model).__name__}: {report.describe()}")
    with torch.no_grad():
        for key, tensor in to_load.items():
            own[key].copy_(tensor)
    report.loaded = list(to_load)
    return report


def load_checkpoint(
    model: nn.Module,
    path: str | os.PathLike,
    *,
    sha256: str | None = None,
    remap: Any = None,
    contents: str = "full",
    strict: bool = True,
) -> LoadReport:
    """Read a checkpoint file safely (:func:`read_checkpoint`), remap its keys (the named function of
    the method's zoo file, or ``None`` for aggzoo's own names) and load it strictly into ``model``."""
    state = read_checkpoint(path, sha256=sha256).state_dict()
    if remap is not None:
        try:
            state = remap(state, model)
        except ConversionError as error:
            raise StateDictMismatchError(f"{path}: {error}") from None
    keep = ("backbone.",) if contents == "delta" else ()
    return load_into(model, state, strict=strict, keep_missing_under=keep, what=str(path))


def load_pretrained(model: nn.Module, cfg: PretrainedCfg, *, strict: bool = True) -> LoadReport:
    """Fetch the weights of ``cfg`` (shipped file, cache or download) and load them into ``model``."""
    path = fetch_weights(cfg)
    return load_checkpoint(model, path, sha256=cfg.sha256, remap=cfg.remap, contents=cfg.contents, strict=strict)
