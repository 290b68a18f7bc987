"""The registry tables: ``<head>_<backbone>`` architectures and their ``.<tag>`` weights, as timm keeps them.

An *architecture* is a function decorated with :func:`register_model` (in a method file of
``aggzoo.zoo``) that builds a :class:`~aggzoo.models.VPRModel` at its paper configuration. A *tag*
names one set of weights for it (:class:`~aggzoo.hub.cfg.PretrainedCfg`): ``.official`` for the
authors' released checkpoint, ``.synthetic`` / ``.nordland_mini`` for weights the project trained
and ships.

A method file declares its weights in a module-level ``pretrained_cfgs`` table (``{"<arch>.<tag>":
PretrainedCfg(...)}``, before its entry points, as timm's ``default_cfgs``); :func:`register_model`
registers the entries of its architecture when it registers the function. The first tag of an
architecture is its default.

This layer holds tables only: it imports no method and reads no file. The tables fill when the
zoo is imported, which only :mod:`aggzoo.hub.factory` does (``aggzoo.list_models`` and friends go
through it). Names resolve through these tables, never through an if/elif chain; an unknown name
is answered with the closest registered names.
"""

from __future__ import annotations

import difflib
import fnmatch
import sys
from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

from aggzoo.errors import UnknownModelError
from aggzoo.hub.cfg import PretrainedCfg, split_name

__all__ = [
    "get_pretrained_cfg",
    "is_model",
    "list_models",
    "list_pretrained",
    "model_entrypoint",
    "register_model",
    "register_pretrained",
    "resolve",
]

#: The name of the table of weights a method file declares (``{"<arch>.<tag>": PretrainedCfg}``).
PRETRAINED_TABLE = "pretrained_cfgs"

_ENTRYPOINTS: dict[str, Callable[..., nn.Module]] = {}
_PRETRAINED: dict[str, dict[str, PretrainedCfg]] = {}


# -- registration ----------------------------------------------------------------------------------


def register_model(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
    """Register an architecture entry point under its function name (``<head>_<backbone>``), with
    the entries of its module's ``pretrained_cfgs`` table that name it.

    The function takes keyword arguments only -- ``pretrained_backbone: bool``, ``backbone_kwargs:
    dict | None`` and the head's own keyword arguments -- and returns a ``VPRModel``.
    """
    name = fn.__name__
    if name in _ENTRYPOINTS and _ENTRYPOINTS[name] is not fn:
        raise ValueError(f"model {name!r} is registered twice ({_ENTRYPOINTS[name].__module__} and {fn.__module__})")
    if "." in name:
        raise ValueError(f"architecture names cannot contain '.', got {name!r} (the tag follows the dot)")
    _ENTRYPOINTS[name] = fn
    _PRETRAINED.setdefault(name, {})
    table: Mapping[str, PretrainedCfg] = getattr(sys.modules.get(fn.__module__), PRETRAINED_TABLE, {})
    for weights_name, cfg in table.items():
        if split_name(weights_name)[0] == name:
            register_pretrained(weights_name, cfg)
    return fn


def register_pretrained(name: str, cfg: PretrainedCfg) -> PretrainedCfg:
    """Register ``cfg`` as ``<architecture>.<tag>`` (the architecture must be registered)."""
    architecture, tag = split_name(name)
    if tag is None:
        raise ValueError(f"a pretrained name needs a tag: '<architecture>.<tag>', got {name!r}")
    if architecture not in _ENTRYPOINTS:
        raise UnknownModelError(f"cannot register weights {name!r}: architecture {architecture!r} is not registered")
    tags = _PRETRAINED[architecture]
    if tag in tags:
        raise ValueError(f"weights {name!r} are registered twice")
    cfg = cfg.with_names(architecture, tag)
    tags[tag] = cfg
    return cfg


# -- listing and lookup ----------------------------------------------------------------------------


def list_models(pattern: str = "*", *, pretrained: bool = False) -> list[str]:
    """Registered architecture names matching the glob ``pattern`` (sorted); with
    ``pretrained=True`` only those that have at least one set of weights."""
    names = [n for n in _ENTRYPOINTS if fnmatch.fnmatchcase(n, pattern)]
    if pretrained:
        names = [n for n in names if any(c.has_weights for c in _PRETRAINED[n].values())]
    return sorted(names)


def list_pretrained(pattern: str = "*", *, with_cfg: bool = False) -> list[str] | list[PretrainedCfg]:
    """``<architecture>.<tag>`` names matching ``pattern`` (sorted); ``with_cfg=True`` returns the
    :class:`PretrainedCfg` objects (source, licence, published metrics, ...) instead."""
    cfgs = [c for tags in _PRETRAINED.values() for c in tags.values() if fnmatch.fnmatchcase(c.name, pattern)]
    cfgs.sort(key=lambda c: c.name)
    return cfgs if with_cfg else [c.name for c in cfgs]


def is_model(name: str) -> bool:
    """Whether ``name`` is a registered architecture or ``<architecture>.<tag>``."""
    architecture, tag = split_name(name)
    return architecture in _ENTRYPOINTS and (tag is None or tag in _PRETRAINED[architecture])


def _unknown(name: str, candidates: list[str], what: str) -> UnknownModelError:
    close = difflib.get_close_matches(name, candidates, n=5, cutoff=0.6)  # 0.5 offered boq_resnet50 for "doesnotexist"
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    return UnknownModelError(f"unknown {what} {name!r}.{hint} See aggzoo.list_models() / aggzoo.list_pretrained().")


def model_entrypoint(architecture: str) -> Callable[..., nn.Module]:
    """The registered entry point of ``architecture``."""
    if architecture not in _ENTRYPOINTS:
        raise _unknown(architecture, sorted(_ENTRYPOINTS), "model")
    return _ENTRYPOINTS[architecture]


def get_pretrained_cfg(name: str) -> PretrainedCfg:
    """The cfg of ``<architecture>.<tag>``, or of the architecture's default tag."""
    architecture, tag = split_name(name)
    model_entrypoint(architecture)
    tags = _PRETRAINED[architecture]
    if tag is None:
        with_weights = [c for c in tags.values() if c.has_weights]
        if not with_weights:
            raise UnknownModelError(f"{architecture!r} has no pretrained weights; list_pretrained() shows what has")
        return with_weights[0]
    if tag not in tags:
        raise _unknown(name, [c.name for c in tags.values()] or list_pretrained(), "pretrained tag")
    return tags[tag]


def resolve(
    name: str, *, pretrained: bool, overrides: Mapping[str, Any] | None = None
) -> tuple[str, PretrainedCfg | None, dict[str, Any]]:
    """``(architecture, cfg or None, entry-point kwargs)`` for a name. A tag selects its weights'
    cfg (for its ``model_kwargs`` even when ``pretrained`` is False); the caller's overrides win."""
    architecture, tag = split_name(name)
    model_entrypoint(architecture)
    cfg = get_pretrained_cfg(name) if (pretrained or tag is not None) else None
    kwargs: dict[str, Any] = dict(cfg.model_kwargs) if cfg is not None else {}
    kwargs.update(overrides or {})
    if cfg is not None and cfg.contents == "delta" and pretrained:
        # The file holds only what training changed: the rest comes from the pretrained backbone.
        kwargs["pretrained_backbone"] = True
    return architecture, (cfg if pretrained else None), kwargs
