"""The model registry: ``<head>_<backbone>[.<tag>]`` names -> models, the way timm does it.

An *architecture* is a function decorated with :func:`register_model` (in ``aggzoo.zoo.*``) that
builds a :class:`~aggzoo.models.VPRModel` at its paper configuration. A *tag* names one set of
weights for it (:class:`~aggzoo.pretrained.PretrainedCfg`): ``.official`` for the authors' released
checkpoint, ``.synthetic`` / ``.nordland_mini`` for weights the project trained and ships.

Names resolve through these tables only (no if/elif dispatch); an unknown name is answered with
the closest registered names. ``create_model`` also accepts:

- ``local-dir:<folder>`` -- a folder written by :func:`aggzoo.save_pretrained`;
- ``hf-hub:<owner>/<repo>`` -- such a folder on the Hugging Face Hub (cached; offline-friendly);
- a path to such a folder, or to a checkpoint that records its model spec (a training checkpoint
  of aggzoo's pipeline, or the safetensors file inside a saved folder).

A model is described by a *spec*, the same shape as the Hydra ``conf/backbone`` and ``conf/head``
files: ``{"backbone": {"_target_": "aggzoo.models.backbones.timm_backbone.TimmBackbone", ...},
"head": {"_target_": "aggzoo.models.heads.gem.GeM", ...}}``. Targets must live under
``aggzoo.models.``, so a config file can only ever build aggzoo modules.
"""

from __future__ import annotations

import copy
import difflib
import fnmatch
import functools
import importlib
import json
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from aggzoo.pretrained import PretrainedCfg, split_name

__all__ = [
    "UnknownModelError",
    "build_head_for",
    "build_model",
    "create_model",
    "get_pretrained_cfg",
    "is_model",
    "list_models",
    "list_pretrained",
    "model_entrypoint",
    "normalise_spec",
    "pretrained_table",
    "register_model",
    "register_pretrained",
    "resolve",
]

_ENTRYPOINTS: dict[str, Callable[..., nn.Module]] = {}
_PRETRAINED: dict[str, dict[str, PretrainedCfg]] = {}
_POPULATED = False
_POPULATE_LOCK = threading.RLock()

_LOCAL_DIR = "local-dir:"
_CHECKPOINT_SUFFIXES = (".ckpt", ".pth", ".pt", ".safetensors", ".bin")
_HF_HUB = "hf-hub:"
_ALLOWED_TARGETS = "aggzoo.models."
_PARTIAL = "_partial_"
_TARGET = "_target_"


class UnknownModelError(ValueError):
    """No registered architecture or tag has this name."""


# ---------------------------------------------------------------------------------------------
# Registration


def register_model(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
    """Register an architecture entry point under its function name (``<head>_<backbone>``).

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
    return fn


def register_pretrained(name: str, cfg: PretrainedCfg) -> PretrainedCfg:
    """Register ``cfg`` as ``<architecture>.<tag>``. The first tag registered for an architecture
    is its default for ``create_model(<architecture>, pretrained=True)``."""
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


def _populate() -> None:
    """Import the zoo (entry points and official weights) and the shipped-weights manifest, once."""
    global _POPULATED
    if _POPULATED:
        return
    with _POPULATE_LOCK:
        if _POPULATED:
            return
        importlib.import_module("aggzoo.zoo")
        from aggzoo.manifest import register_manifest

        register_manifest()
        _POPULATED = True


# ---------------------------------------------------------------------------------------------
# Listing and lookup


def list_models(pattern: str = "*", *, pretrained: bool = False) -> list[str]:
    """Registered architecture names matching the glob ``pattern`` (sorted); with
    ``pretrained=True`` only those that have at least one set of weights."""
    _populate()
    names = [n for n in _ENTRYPOINTS if fnmatch.fnmatchcase(n, pattern)]
    if pretrained:
        names = [n for n in names if any(c.has_weights for c in _PRETRAINED[n].values())]
    return sorted(names)


def list_pretrained(pattern: str = "*", *, with_cfg: bool = False) -> list[str] | list[PretrainedCfg]:
    """``<architecture>.<tag>`` names matching ``pattern`` (sorted); ``with_cfg=True`` returns the
    :class:`PretrainedCfg` objects (source, licence, published metrics, ...) instead."""
    _populate()
    cfgs = [c for tags in _PRETRAINED.values() for c in tags.values() if fnmatch.fnmatchcase(c.name, pattern)]
    cfgs.sort(key=lambda c: c.name)
    return cfgs if with_cfg else [c.name for c in cfgs]


def pretrained_table(pattern: str = "*") -> str:
    """A Markdown table of the weights matching ``pattern``: descriptor size, input size, source,
    licence and the recorded R@1 figures (``python -m aggzoo.zoo [pattern]`` prints it)."""
    rows = ["| name | D | input | source | licence | R@1 (published or measured) |", "|---|---|---|---|---|---|"]
    for cfg in list_pretrained(pattern, with_cfg=True):
        recalls = ", ".join(f"{k.removesuffix('/R@1')} {v:g}" for k, v in cfg.metrics.items() if k.endswith("/R@1"))
        size = "x".join(str(v) for v in cfg.input_size[1:])
        cells = [cfg.name, cfg.out_dim or "?", size, cfg.source, cfg.license or "?", recalls or "-"]
        rows.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(rows)


def is_model(name: str) -> bool:
    _populate()
    architecture, tag = split_name(name)
    return architecture in _ENTRYPOINTS and (tag is None or tag in _PRETRAINED[architecture])


def _unknown(name: str, candidates: list[str], what: str) -> UnknownModelError:
    close = difflib.get_close_matches(name, candidates, n=5, cutoff=0.5)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    return UnknownModelError(f"unknown {what} {name!r}.{hint} See aggzoo.list_models() / aggzoo.list_pretrained().")


def model_entrypoint(architecture: str) -> Callable[..., nn.Module]:
    _populate()
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


# ---------------------------------------------------------------------------------------------
# Specs: building a model from {"backbone": {...}, "head": {...}}


def _plain(value: Any) -> Any:
    """JSON-ready copy (tuples -> lists; OmegaConf containers -> dicts/lists)."""
    if type(value).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        value = OmegaConf.to_container(value, resolve=True)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"model specs hold only JSON values (numbers, strings, lists, dicts); got {type(value).__name__}")


def normalise_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Validated JSON-ready copy of a spec (``_partial_`` dropped)."""
    spec = _plain(spec)
    if not isinstance(spec, dict) or set(spec) != {"backbone", "head"}:
        got = sorted(spec) if isinstance(spec, dict) else spec
        raise ValueError(f"a model spec is {{'backbone': {{...}}, 'head': {{...}}}}; got {got!r}")
    for part in ("backbone", "head"):
        section = spec[part]
        if not isinstance(section, dict) or not isinstance(section.get(_TARGET), str):
            raise ValueError(f"spec[{part!r}] needs a '{_TARGET}' naming a class under {_ALLOWED_TARGETS}")
        section.pop(_PARTIAL, None)
        extra = [k for k in section if k.startswith("_") and k != _TARGET]
        if extra:
            raise ValueError(f"spec[{part!r}]: unsupported keys {extra} (only '{_TARGET}' and constructor arguments)")
        nested = [k for k, v in section.items() if isinstance(v, dict) and _TARGET in v]
        if nested:
            raise ValueError(f"spec[{part!r}]: nested '{_TARGET}' values are not supported ({nested})")
    return spec


def _import_target(path: str, base: type) -> type:
    if not path.startswith(_ALLOWED_TARGETS):
        raise ValueError(f"refusing to build {path!r}: model specs may only name classes under {_ALLOWED_TARGETS}")
    module_name, _, attr = path.rpartition(".")
    try:
        target = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"cannot import {path!r} named in a model spec: {error}") from None
    if not (isinstance(target, type) and issubclass(target, base)):
        raise ValueError(f"{path!r} is not a {base.__name__} subclass")
    return target


def build_model(spec: Mapping[str, Any], *, pretrained_backbone: bool | None = None) -> nn.Module:
    """A ``VPRModel`` from a spec. ``pretrained_backbone`` overrides the spec's ``pretrained``."""
    from aggzoo.models.heads.base import Head
    from aggzoo.models.vpr_model import VPRModel

    spec = normalise_spec(spec)
    if pretrained_backbone is not None:
        spec["backbone"]["pretrained"] = bool(pretrained_backbone)
    backbone_cls = _import_target(spec["backbone"][_TARGET], nn.Module)
    head_cls = _import_target(spec["head"][_TARGET], Head)
    backbone_kwargs = {k: v for k, v in spec["backbone"].items() if k != _TARGET}
    head_kwargs = {k: v for k, v in spec["head"].items() if k != _TARGET}
    backbone = backbone_cls(**backbone_kwargs)
    try:
        head = functools.partial(head_cls, **head_kwargs)
        model = VPRModel(backbone, head)
    except TypeError as error:
        raise TypeError(f"cannot build {head_cls.__name__} with {head_kwargs}: {error}") from None
    model.aggzoo_spec = spec
    return model


def build_head_for(architecture: str, kwargs: Mapping[str, Any], backbone: nn.Module) -> tuple[nn.Module, nn.Module]:
    """The head of ``architecture`` built for ``backbone``, plus a reference model of the original
    architecture on the meta device (shapes only) for key remapping. Checks channel counts."""
    from aggzoo.models.vpr_model import build_head

    fn = model_entrypoint(architecture)
    kwargs = {k: v for k, v in kwargs.items() if k != "pretrained_backbone"}
    with torch.device("meta"):
        reference = fn(pretrained_backbone=False, **kwargs)
    spec = reference.aggzoo_spec
    head_cls = _import_target(spec["head"][_TARGET], nn.Module)
    expected = head_cls.in_channels_from(reference.backbone.feature_info)
    if not hasattr(backbone, "feature_info"):
        raise ValueError("load_head needs a backbone exposing feature_info (e.g. aggzoo TimmBackbone)")
    given = head_cls.in_channels_from(backbone.feature_info)
    if given != expected:
        raise ValueError(
            f"the {architecture} head was trained on {expected} input channels "
            f"({reference.backbone.model_name if hasattr(reference.backbone, 'model_name') else 'its backbone'}), "
            f"but this backbone gives {given}; pick a backbone (or out_indices) with {expected} channels"
        )
    head_kwargs = {k: v for k, v in spec["head"].items() if k != _TARGET}
    head = build_head(functools.partial(head_cls, **head_kwargs), backbone)
    return head, reference


# ---------------------------------------------------------------------------------------------
# create_model


def create_model(
    name: str,
    pretrained: bool = False,
    *,
    checkpoint_path: str | os.PathLike | None = None,
    pretrained_backbone: bool | None = None,
    backbone_kwargs: Mapping[str, Any] | None = None,
    **overrides: Any,
) -> nn.Module:
    """Build a model by name, optionally with weights.

    Args:
        name: ``<head>_<backbone>`` (an architecture), ``<head>_<backbone>.<tag>`` (weights),
            ``local-dir:<folder>``, ``hf-hub:<owner>/<repo>``, or a path to a saved folder.
        pretrained: load the tag's weights (the architecture's default tag when none is given).
        checkpoint_path: load this file instead (aggzoo names, a Lightning checkpoint of aggzoo's
            pipeline, or -- with a tag naming an upstream release -- the authors' file, remapped).
        pretrained_backbone: build the backbone with its own pretrained weights (ImageNet / DINOv2).
        backbone_kwargs: extra arguments for the backbone (``img_size``, ``frozen_stages``, ...).
        **overrides: the head's keyword arguments (``num_clusters=32``).

    Returns:
        A ``VPRModel`` in eval mode when weights were loaded (train mode otherwise), with
        ``.pretrained_cfg`` (preprocessing, provenance), ``.aggzoo_spec`` and ``.aggzoo_architecture``.
    """
    if name.startswith(_LOCAL_DIR):
        return _from_local_dir(Path(name[len(_LOCAL_DIR):]).expanduser(), overrides, backbone_kwargs)
    if name.startswith(_HF_HUB):
        return _from_local_dir(_hf_hub_folder(name[len(_HF_HUB):]), overrides, backbone_kwargs)
    if os.sep in name or name.startswith((".", "~")) or Path(name).suffix in _CHECKPOINT_SUFFIXES:
        path = Path(name).expanduser()
        if path.is_dir():
            return _from_local_dir(path, overrides, backbone_kwargs)
        if path.is_file():
            return _from_checkpoint_file(path, overrides, backbone_kwargs)
        raise ValueError(f"{name!r} looks like a path, but there is no such file or folder")
    _populate()
    architecture, cfg, kwargs = resolve(name, pretrained=pretrained and checkpoint_path is None, overrides=overrides)
    if pretrained_backbone is not None:
        kwargs["pretrained_backbone"] = pretrained_backbone
    if backbone_kwargs:
        kwargs["backbone_kwargs"] = dict(backbone_kwargs)
    model = _ENTRYPOINTS[architecture](**kwargs)
    model.aggzoo_architecture = architecture
    _, tag = split_name(name)
    info = cfg if cfg is not None else (_PRETRAINED[architecture].get(tag) if tag else None)
    model.pretrained_cfg = info
    if checkpoint_path is not None:
        from aggzoo.hub import load_checkpoint

        remap = info.remap if info is not None else None
        sha = info.sha256 if (info is not None and info.file is None) else None
        load_checkpoint(model, checkpoint_path, sha256=sha, remap=remap)
        model.eval()
    elif cfg is not None:
        from aggzoo.hub import load_pretrained

        load_pretrained(model, cfg)
        model.eval()
    return model


def _from_local_dir(folder: Path, overrides: Mapping[str, Any], backbone_kwargs: Mapping[str, Any] | None) -> nn.Module:
    from aggzoo.hub import load_checkpoint, read_local_dir

    config, weights = read_local_dir(folder)
    spec = copy.deepcopy(config["spec"])
    spec["head"].update(overrides)
    spec["backbone"].update(backbone_kwargs or {})
    model = build_model(spec, pretrained_backbone=False)
    load_checkpoint(model, weights)
    model.aggzoo_architecture = config.get("architecture")
    saved_cfg = config.get("pretrained_cfg")
    model.pretrained_cfg = _cfg_from_json(saved_cfg) if saved_cfg else None
    return model.eval()


def _from_checkpoint_file(
    path: Path, overrides: Mapping[str, Any], backbone_kwargs: Mapping[str, Any] | None
) -> nn.Module:
    from aggzoo.hub import load_checkpoint, read_spec

    spec = normalise_spec(read_spec(path))
    spec["head"].update(overrides)
    spec["backbone"].update(backbone_kwargs or {})
    model = build_model(spec, pretrained_backbone=False)
    load_checkpoint(model, path)
    model.aggzoo_architecture = None
    model.pretrained_cfg = None
    return model.eval()


def _cfg_from_json(data: Mapping[str, Any]) -> PretrainedCfg:
    keep = {"architecture", "tag", "model_kwargs", "input_size", "mean", "std", "interpolation", "out_dim",
            "recipe", "license", "paper", "code", "metrics", "notes"}
    values = {k: v for k, v in data.items() if k in keep and v is not None}
    for key in ("input_size", "mean", "std"):
        if key in values:
            values[key] = tuple(values[key])
    return PretrainedCfg(**values)


def _hf_hub_folder(repo: str) -> Path:
    """Download (once) a save_pretrained folder from the Hugging Face Hub into the cache."""
    from aggzoo.hub import CONFIG_FILE, WEIGHTS_FILE, cache_dir, download

    repo = repo.strip("/")
    if repo.count("/") != 1:
        raise ValueError(f"hf-hub names read 'hf-hub:<owner>/<repo>', got {repo!r}")
    folder = cache_dir() / "hf-hub" / repo.replace("/", "--")
    for filename in (CONFIG_FILE, WEIGHTS_FILE):
        target = folder / filename
        if not target.is_file():
            url = f"https://huggingface.co/{repo}/resolve/main/{filename}"
            download(url, target, sha256=None, name=f"hf-hub:{repo}")
    json.loads((folder / CONFIG_FILE).read_text())  # fail early on a truncated config
    return folder

