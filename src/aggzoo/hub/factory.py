"""The top of :mod:`aggzoo.hub`: ``create_model``, ``load_head`` and the listings, with the zoo loaded.

This is the only module that imports :mod:`aggzoo.zoo` (which fills the registry tables with every
method file's entry points and official weights) and registers the shipped weights of
``weights/manifest.json``. Every name ``create_model`` takes ends in the one builder
(:func:`aggzoo.hub.builder.build_model`) and the one checkpoint reader
(:func:`aggzoo.hub.checkpoint.read_checkpoint`).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import nn

from aggzoo.errors import ManifestError, UserError, WeightsUnavailableError
from aggzoo.hub import registry
from aggzoo.hub.builder import build_head_for, build_model
from aggzoo.hub.cfg import PretrainedCfg, split_name
from aggzoo.hub.checkpoint import read_checkpoint
from aggzoo.hub.download import fetch_weights, hf_hub_folder
from aggzoo.hub.loading import load_checkpoint, load_into, load_pretrained
from aggzoo.hub.manifest import manifest_path, register_manifest
from aggzoo.hub.registry import (
    get_pretrained_cfg,
    is_model,
    list_models,
    model_entrypoint,
    resolve,
)
from aggzoo.hub.saving import read_local_dir
from aggzoo.models.vpr_model import VPRModel
from aggzoo.zoo import import_method_files

__all__ = [
    "create_model",
    "get_pretrained_cfg",
    "is_model",
    "list_models",
    "list_pretrained",
    "load_head",
    "model_entrypoint",
]

import_method_files()


def _register_shipped_weights() -> ManifestError | None:
    """Register the manifest's tags; a broken manifest (``AGGZOO_WEIGHTS_DIR``) must not break the
    import of every entry point, so its error is kept and raised by the first call that needs names."""
    try:
        register_manifest()
    except UserError as error:
        message = str(error) if str(manifest_path()) in str(error) else f"{manifest_path()}: {error}"
        return ManifestError(f"the shipped-weights manifest cannot be used: {message}. Fix or remove the entry "
                             "(or point AGGZOO_WEIGHTS_DIR at a folder with a valid manifest.json)")
    return None


_MANIFEST_ERROR = _register_shipped_weights()


def _manifest_ok() -> None:
    if _MANIFEST_ERROR is not None:
        raise ManifestError(str(_MANIFEST_ERROR))


def list_pretrained(pattern: str = "*", *, with_cfg: bool = False) -> list[str] | list[PretrainedCfg]:
    """``<architecture>.<tag>`` names matching ``pattern`` (sorted); ``with_cfg=True`` returns the
    :class:`PretrainedCfg` objects (source, licence, published metrics, ...) instead. Raises the
    :class:`ManifestError` of a broken shipped-weights manifest."""
    _manifest_ok()
    return registry.list_pretrained(pattern, with_cfg=with_cfg)

_LOCAL_DIR = "local-dir:"
_HF_HUB = "hf-hub:"
_CHECKPOINT_SUFFIXES = (".ckpt", ".pth", ".pt", ".safetensors", ".bin")


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
            ``local-dir:<folder>``, ``hf-hub:<owner>/<repo>``, or a path to a saved folder or to a
            checkpoint that records its model (a ``train.py`` checkpoint, a saved safetensors file).
        pretrained: load the tag's weights (the architecture's default tag when none is given).
        checkpoint_path: load this file instead (aggzoo names, a Lightning checkpoint of aggzoo's
            pipeline, or -- with a tag naming an upstream release -- the authors' file, remapped). With
            ``pretrained_backbone=True`` (or a tag whose weights are a delta) the file may leave out the
            backbone's tensors, which keep their pretrained values (an ``aggzoo vocabulary`` file).
        pretrained_backbone: build the backbone with its own pretrained weights (ImageNet / DINOv2).
        backbone_kwargs: extra arguments for the backbone (``img_size``, ``frozen_stages``, ...).
        **overrides: the head's keyword arguments (``num_clusters=32``).

    Returns:
        A ``VPRModel`` in eval mode when weights were loaded (train mode otherwise), with
        ``.pretrained_cfg`` (preprocessing, provenance), ``.aggzoo_spec`` and ``.aggzoo_architecture``.
    """
    _manifest_ok()
    if name.startswith(_LOCAL_DIR):
        return _from_local_dir(Path(name[len(_LOCAL_DIR):]).expanduser(), overrides, backbone_kwargs)
    if name.startswith(_HF_HUB):
        return _from_local_dir(hf_hub_folder(name[len(_HF_HUB):]), overrides, backbone_kwargs)
    if _looks_like_a_path(name):
        path = Path(name).expanduser()
        if path.is_dir():
            return _from_local_dir(path, overrides, backbone_kwargs)
        if path.is_file():
            return _from_checkpoint_file(path, overrides, backbone_kwargs)
        raise WeightsUnavailableError(f"{name!r} looks like a path, but there is no such file or folder")
    architecture, cfg, kwargs = resolve(name, pretrained=pretrained and checkpoint_path is None, overrides=overrides)
    tag = split_name(name)[1]
    info = cfg if cfg is not None else (get_pretrained_cfg(name) if tag else None)
    if checkpoint_path is not None and info is not None and info.contents == "delta":
        # the tag's own file (or another of its layout) holds no backbone: build it pretrained, as resolve does
        kwargs["pretrained_backbone"] = True
    if pretrained_backbone is not None:
        kwargs["pretrained_backbone"] = pretrained_backbone
    if backbone_kwargs:
        kwargs["backbone_kwargs"] = dict(backbone_kwargs)
    model = model_entrypoint(architecture)(**kwargs)
    model.aggzoo_architecture = architecture
    model.pretrained_cfg = info
    if checkpoint_path is not None:
        remap = info.remap if info is not None else None
        sha = info.sha256 if (info is not None and info.file is None) else None
        delta = bool(kwargs.get("pretrained_backbone"))
        load_checkpoint(model, checkpoint_path, sha256=sha, remap=remap, contents="delta" if delta else "full")
        model.eval()
    elif cfg is not None:
        load_pretrained(model, cfg)
        model.eval()
    return model


def _looks_like_a_path(name: str) -> bool:
    """A name with a folder separator, a checkpoint suffix, a leading ``.`` / ``~``, or that is no
    registered name but an existing file or folder (``create_model("my_run")`` from its parent)."""
    if os.sep in name or name.startswith((".", "~")) or Path(name).suffix in _CHECKPOINT_SUFFIXES:
        return True
    return not is_model(name) and Path(name).exists()


def _with_overrides(spec: Mapping[str, Any], overrides: Mapping[str, Any],
                    backbone_kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    spec = copy.deepcopy(dict(spec))
    spec["head"].update(overrides)
    spec["backbone"].update(backbone_kwargs or {})
    return spec


def _from_local_dir(folder: Path, overrides: Mapping[str, Any], backbone_kwargs: Mapping[str, Any] | None) -> nn.Module:
    config, weights = read_local_dir(folder)
    model = build_model(_with_overrides(config["spec"], overrides, backbone_kwargs), pretrained_backbone=False,
                        where=str(folder))
    load_checkpoint(model, weights)
    model.aggzoo_architecture = config.get("architecture")
    saved_cfg = config.get("pretrained_cfg")
    model.pretrained_cfg = PretrainedCfg.from_json(saved_cfg) if saved_cfg else None
    return model.eval()


def _from_checkpoint_file(path: Path, overrides: Mapping[str, Any],
                          backbone_kwargs: Mapping[str, Any] | None) -> nn.Module:
    checkpoint = read_checkpoint(path)
    spec = _with_overrides(checkpoint.require_spec(), overrides, backbone_kwargs)
    state = checkpoint.state_dict()
    # A file without any backbone tensor over a spec whose backbone is pretrained (``aggzoo vocabulary`` of
    # a model on DINOv2) is a delta: the backbone comes from its own pretrained weights. Any other file
    # holds every tensor, so nothing is downloaded for it.
    delta = bool(spec["backbone"].get("pretrained")) and not any(k.startswith("backbone.") for k in state)
    model = build_model(spec, pretrained_backbone=delta, where=str(path))
    load_into(model, state, what=str(path), keep_missing_under=("backbone.",) if delta else ())
    model.aggzoo_architecture = None
    model.pretrained_cfg = None
    return model.eval()


def load_head(name: str, backbone: nn.Module, *, pretrained: bool = True, **head_overrides: Any) -> VPRModel:
    """A registered model's head, with its pretrained weights, on another (compatible) backbone.

    Args:
        name: ``<architecture>[.<tag>]`` (``netvlad_efficientnet_lite0.nordland_mini``).
        backbone: any module returning ``Features`` and exposing ``feature_info`` (a
            :class:`~aggzoo.models.backbones.timm_backbone.TimmBackbone`). Its channels must be
            those the head was trained on.
        pretrained: load the head's weights (else a freshly initialised head of that architecture).

    Returns:
        ``VPRModel(backbone, head)``.

    Raises:
        ConfigError: when the backbone's channels differ from what the head expects.
    """
    _manifest_ok()
    architecture, cfg, kwargs = resolve(name, pretrained=pretrained, overrides=head_overrides)
    head, reference = build_head_for(architecture, kwargs, backbone)
    model = VPRModel(backbone, head)
    if cfg is None:
        return model
    state = read_checkpoint(fetch_weights(cfg), sha256=cfg.sha256).state_dict()
    if cfg.remap is not None:
        state = cfg.remap(state, reference)
    head_state = {k[len("head."):]: v for k, v in state.items() if k.startswith("head.")}
    load_into(head, head_state, what=f"{cfg.name} (head)")
    model.pretrained_cfg = cfg
    return model
