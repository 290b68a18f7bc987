"""Pieces every converter and reader of state dicts uses: recognise a state dict, rename keys by
explicit rules, report leftovers.

A converter is a named function ``(state_dict, model) -> state_dict`` that renames an upstream
checkpoint's keys to aggzoo's. It never guesses: every upstream key must match exactly one rule (a
rule may drop a key on purpose, saying why), and the result is then loaded strictly, so a key
that lands nowhere or a tensor of the wrong shape is an error that names it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from torch import Tensor

from aggzoo.errors import ConversionError

__all__ = ["Rule", "is_state_dict", "rename", "show_keys", "strip_prefix"]

#: ``(regex over the upstream key, replacement)``; a ``None`` replacement drops the key.
Rule = tuple[str, str | None]


def is_state_dict(obj: object) -> bool:
    """Whether ``obj`` is a non-empty mapping of names to tensors."""
    return isinstance(obj, Mapping) and bool(obj) and all(isinstance(v, Tensor) for v in obj.values())


def show_keys(keys: Iterable[str], limit: int = 12) -> str:
    """``'a', 'b', ... (N more)``: key names for messages."""
    keys = list(keys)
    shown = ", ".join(repr(k) for k in keys[:limit])
    return shown + (f", ... ({len(keys) - limit} more)" if len(keys) > limit else "")


def strip_prefix(state: Mapping[str, Tensor], prefix: str) -> dict[str, Tensor]:
    """Remove ``prefix`` from every key; a key without it is an error."""
    missing = [k for k in state if not k.startswith(prefix)]
    if missing:
        raise ConversionError(f"expected every key to start with {prefix!r}; these do not: {show_keys(missing)}")
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
            f"checkpoint the converter was written for: {show_keys(unmatched)}"
        )
    return out

