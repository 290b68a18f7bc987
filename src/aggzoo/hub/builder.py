"""The one spec builder: ``{"backbone": {...}, "head": {...}}`` -> ``VPRModel``, for every path.

A *spec* has the shape of the Hydra ``conf/backbone`` and ``conf/head`` files::

    {"backbone": {"_target_": "aggzoo.models.backbones.timm_backbone.TimmBackbone", "model_name": ...},
     "head": {"_target_": "aggzoo.models.heads.gem.GeM", "p": 3.0}}

Every way a model is made from stored or configured data goes through :func:`build_model`:
``train.py`` (from its config), ``train.py ckpt_path=`` (resume), ``eval.py``, ``create_model`` of a
file, a ``local-dir:`` / ``hf-hub:`` folder or a name, ``torch.hub.load``, export and ``manifest
verify``. A spec read from a file is data, never code: each ``_target_`` must be one of the classes
in :func:`allowed_classes` (an allowlist of aggzoo's own backbones and heads, not a pattern), and
anything else is refused with :class:`~aggzoo.errors.UnsafeSpecError` before it is imported or
called. Only constructor keyword arguments with JSON values are accepted (no ``_args_``, no nested
``_target_``).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import torch
from torch import nn

from aggzoo.errors import ConfigError, UnsafeSpecError
from aggzoo.hub.registry import model_entrypoint
from aggzoo.models import backbones as backbone_package
from aggzoo.models import heads as head_package
from aggzoo.models.backbones.timm_backbone import TimmBackbone
from aggzoo.models.heads.base import Head
from aggzoo.models.vpr_model import VPRModel, build_head

__all__ = ["allowed_classes", "build_head_for", "build_model", "class_path", "normalise_spec"]

_TARGET = "_target_"
_PARTIAL = "_partial_"
_PARTS = {"backbone": TimmBackbone, "head": Head}
#: Targets of classes that moved, as checkpoints written before the move name them.
_MOVED = MappingProxyType({
    # MultiLevel(attention=False) was IDA; AFA still takes the attention flag, so both old specs build.
    "aggzoo.models.heads.multilevel.MultiLevel": "aggzoo.models.heads.afa.AFA",
    "aggzoo.models.heads.image_tokens.ImAgeTokens": "aggzoo.models.heads.image.ImAgeTokens",
})


def class_path(cls: type) -> str:
    """The ``_target_`` that names ``cls``: ``"<module>.<qualname>"``."""
    return f"{cls.__module__}.{cls.__qualname__}"


@functools.cache
def allowed_classes() -> Mapping[str, type]:
    """Every class a spec may name, by dotted path: the backbones (:class:`TimmBackbone` and its
    subclasses) and heads (concrete :class:`Head` subclasses) defined in ``aggzoo.models``.

    The modules of ``aggzoo.models.backbones`` and ``aggzoo.models.heads`` are imported from the
    package folders (never from a name in a spec), so a new head file is allowed the moment it exists.
    """
    for package in (backbone_package, head_package):
        for module in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
            importlib.import_module(module.name)
    allowed: dict[str, type] = {}
    for base in _PARTS.values():
        stack = [base]
        while stack:
            cls = stack.pop()
            stack.extend(cls.__subclasses__())
            if cls is not Head and cls.__module__.startswith("aggzoo.models."):
                allowed[class_path(cls)] = cls
    return MappingProxyType(allowed)


def _plain(value: Any, where: str) -> Any:
    """JSON-ready copy (tuples and sequences -> lists, mappings -> dicts), refusing anything else."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v, where) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [_plain(v, where) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise UnsafeSpecError(f"{where}: a model spec holds only JSON values (numbers, strings, lists, dicts); "
                          f"got {type(value).__name__}")


def normalise_spec(spec: Mapping[str, Any], *, where: str = "model spec") -> dict[str, Any]:
    """A validated JSON-ready copy of ``spec`` (``_partial_`` dropped, moved targets renamed).

    Args:
        where: what the spec came from (a checkpoint path, a config), for messages.

    Raises:
        UnsafeSpecError: the spec is malformed or names a target outside :func:`allowed_classes`;
            nothing it names has been imported or called.
    """
    if not isinstance(spec, Mapping):
        raise UnsafeSpecError(f"{where}: a model spec is {{'backbone': {{...}}, 'head': {{...}}}}; "
                              f"got a {type(spec).__name__}")
    spec = _plain(spec, where)
    if set(spec) != set(_PARTS):
        raise UnsafeSpecError(f"{where}: a model spec is {{'backbone': {{...}}, 'head': {{...}}}}; got keys {sorted(spec)}")
    allowed = allowed_classes()
    for part, base in _PARTS.items():
        section = spec[part]
        if not isinstance(section, dict) or not isinstance(section.get(_TARGET), str):
            raise UnsafeSpecError(f"{where}: spec[{part!r}] needs a '{_TARGET}' naming an aggzoo {part} class")
        section.pop(_PARTIAL, None)
        target = section[_TARGET] = _MOVED.get(section[_TARGET], section[_TARGET])
        if not isinstance(allowed.get(target), type) or not issubclass(allowed[target], base):
            raise UnsafeSpecError(
                f"{where}: refusing to build {target!r} as the {part}: a model spec may only name aggzoo's own "
                f"{part} classes ({', '.join(sorted(p.rsplit('.', 1)[-1] for p, c in allowed.items() if issubclass(c, base)))}). "
                "Nothing was imported or called.")
        extra = [k for k in section if k.startswith("_") and k != _TARGET]
        if extra:
            raise UnsafeSpecError(f"{where}: spec[{part!r}] has unsupported keys {extra} "
                                  f"(only '{_TARGET}' and constructor arguments)")
        nested = [k for k, v in section.items() if isinstance(v, dict) and _TARGET in v]
        if nested:
            raise UnsafeSpecError(f"{where}: spec[{part!r}]: nested '{_TARGET}' values are not supported ({nested})")
    return spec


def _check_arguments(cls: type, kwargs: Mapping[str, Any], where: str, *, leading: tuple[Any, ...] = ()) -> None:
    try:
        inspect.signature(cls).bind(*leading, **kwargs)
    except TypeError as error:
        raise ConfigError(f"{where}: cannot build {cls.__name__} with {dict(kwargs)}: {error}") from None


def build_model(spec: Mapping[str, Any], *, pretrained_backbone: bool | None = None,
                where: str = "model spec") -> VPRModel:
    """A ``VPRModel`` from a spec (see the module docstring); ``pretrained_backbone`` overrides the
    spec's ``pretrained``. The normalised spec is kept as ``model.aggzoo_spec``."""
    spec = normalise_spec(spec, where=where)
    if pretrained_backbone is not None:
        spec["backbone"]["pretrained"] = bool(pretrained_backbone)
    allowed = allowed_classes()
    backbone_cls, head_cls = (allowed[spec[part][_TARGET]] for part in _PARTS)
    backbone_kwargs = {k: v for k, v in spec["backbone"].items() if k != _TARGET}
    head_kwargs = {k: v for k, v in spec["head"].items() if k != _TARGET}
    _check_arguments(backbone_cls, backbone_kwargs, where)
    _check_arguments(head_cls, head_kwargs, where, leading=(None,))
    model = VPRModel(backbone_cls(**backbone_kwargs), functools.partial(head_cls, **head_kwargs))
    model.aggzoo_spec = spec
    return model


def build_head_for(architecture: str, kwargs: Mapping[str, Any], backbone: nn.Module) -> tuple[Head, VPRModel]:
    """The head of ``architecture`` built for ``backbone``, plus a reference model of the original
    architecture on the meta device (shapes only) for key remapping. Checks channel counts."""
    fn = model_entrypoint(architecture)
    kwargs = {k: v for k, v in kwargs.items() if k != "pretrained_backbone"}
    with torch.device("meta"):
        reference = fn(pretrained_backbone=False, **kwargs)
    spec = reference.aggzoo_spec
    head_cls = allowed_classes()[spec["head"][_TARGET]]
    if not hasattr(backbone, "feature_info"):
        raise ConfigError("load_head needs a backbone exposing feature_info (e.g. aggzoo TimmBackbone)")
    expected = head_cls.in_channels_from(reference.backbone.feature_info)
    given = head_cls.in_channels_from(backbone.feature_info)
    if given != expected:
        raise ConfigError(
            f"the {architecture} head was trained on {expected} input channels "
            f"({getattr(reference.backbone, 'model_name', 'its backbone')}), "
            f"but this backbone gives {given}; pick a backbone (or out_indices) with {expected} channels"
        )
    head_kwargs = {k: v for k, v in spec["head"].items() if k != _TARGET}
    head = build_head(functools.partial(head_cls, **head_kwargs), backbone)
    return head, reference
