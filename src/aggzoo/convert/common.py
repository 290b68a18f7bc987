"""Pieces every converter uses: unwrap a checkpoint, rename keys by explicit rules, report leftovers.

A converter is a named function ``(state_dict, model) -> state_dict`` that renames an upstream
checkpoint's keys to aggzoo's. It never guesses: every upstream key must match exactly one rule (a
rule may drop a key on purpose, saying why), and the result is then loaded strictly, so a key
that lands nowhere or a tensor of the wrong shape is an error that names it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from torch import Tensor

__all__ = [
    "ConversionError",
    "Rule",
    "rename",
    "strip_prefix",
    "unwrap_checkpoint",
]

#: ``(regex over the upstream key, replacement)``; a ``None`` replacement drops the key.
Rule = tuple[str, str | None]

# Containers that training scripts wrap a state dict in, most specific first: Lightning saves
# {"state_dict": ...}; the deep-visual-geo-localization-benchmark family (ImAge, EDTformer,
# CricaVPR) saves {"model_state_dict": ...}; several others save {"model": ...}.
_CONTAINER_KEYS = ("state_dict", "model_state_dict", "model")
_DATA_PARALLEL = "module."
# A LightningModule of our own pipeline holds the VPRModel as ``self.model``.
_LIGHTNING_MODEL = "model."
_OUR_ROOTS = ("backbone.", "head.")


class ConversionError(ValueError):
    """A checkpoint does not have the layout a converter expects."""


def _is_state_dict(obj: object) -> bool:
    return isinstance(obj, Mapping) and bool(obj) and all(isinstance(v, Tensor) for v in obj.values())


def _show(keys: Iterable[str], limit: int = 12) -> str:
    keys = list(keys)
    shown = ", ".join(repr(k) for k in keys[:limit])
    return shown + (f", ... ({len(keys) - limit} more)" if len(keys) > limit else "")


def unwrap_checkpoint(obj: object) -> dict[str, Tensor]:
    """The state dict inside whatever a training script saved.

    Accepts a raw state dict, Lightning's ``{"state_dict": ...}``, ``{"model_state_dict": ...}``
    and ``{"model": ...}``; removes the ``module.`` prefix ``nn.DataParallel`` adds; and, for a
    checkpoint of aggzoo's own Lightning module (keys ``model.backbone.*`` / ``model.head.*``),
    keeps the model's keys without the ``model.`` prefix (loss or metric state is dropped).
    """
    found = obj
    if not _is_state_dict(found):
        if not isinstance(found, Mapping):
            raise ConversionError(f"expected a state dict (a mapping of names to tensors), got {type(found).__name__}")
        for key in _CONTAINER_KEYS:
            if key in found and _is_state_dict(found[key]):
                found = found[key]
                break
        else:
            raise ConversionError(
                "expected a state dict, or a dict holding one under one of "
                f"{list(_CONTAINER_KEYS)}; this checkpoint's top-level keys are {_show(map(str, found))}"
            )
    state = dict(found)
    if all(k.startswith(_DATA_PARALLEL) for k in state):
        state = strip_prefix(state, _DATA_PARALLEL)
    if any(k.startswith(_LIGHTNING_MODEL + root) for k in state for root in _OUR_ROOTS):
        state = {k[len(_LIGHTNING_MODEL):]: v for k, v in state.items() if k.startswith(_LIGHTNING_MODEL)}
    return state


def strip_prefix(state: Mapping[str, Tensor], prefix: str) -> dict[str, Tensor]:
    """Remove ``prefix`` from every key; a key without it is an error."""
    missing = [k for k in state if not k.startswith(prefix)]
    if missing:
        raise ConversionError(f"expected every key to start with {prefix!r}; these do not: {_show(missing)}")
    return {k[len(prefix):]: v for k, v in state.items()}


def rename(state: Mapping[str, Tensor], rules: Sequence[Rule], *, what: str) -> dict[str, Tensor]:
    """Rename every key by the first rule whose regex matches it in full.

    Args:
        state: upstream state dict.
        rules: ``(pattern, replacement)`` pairs, tried in order (``re.fullmatch``); the replacement
            may use groups (``r"\\1"``); ``None`` drops the key.
        what: the checkpoint's name, for error messages ("SALAD (serizba/salad)").

    Raises:
        ConversionError: naming the keys no rule matches, or two keys that map to one name.
    """
    compiled = [(re.compile(pattern), replacement) for pattern, replacement in rules]
    out: dict[str, Tensor] = {}
    origin: dict[str, str] = {}
    unmatched: list[str] = []
    for key, tensor in state.items():
        for pattern, replacement in compiled:
            match = pattern.fullmatch(key)
            if match is None:
                continue
            if replacement is not None:
                new = match.expand(replacement)
                if new in out:
                    raise ConversionError(f"{what}: keys {origin[new]!r} and {key!r} both map to {new!r}")
                out[new] = tensor
                origin[new] = key
            break
        else:
            unmatched.append(key)
    if unmatched:
        raise ConversionError(
            f"{what}: {len(unmatched)} checkpoint key(s) match no conversion rule, so this is not the "
            f"checkpoint the converter was written for: {_show(unmatched)}"
        )
    return out

