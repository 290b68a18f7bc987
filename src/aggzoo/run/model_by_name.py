"""Which model a config names (``eval.py model=<name>``, ``ckpt_path=``, clique mining's ``descriptor_model``),
loaded through the one reader and builder.

A name is anything :func:`aggzoo.create_model` takes -- ``<arch>.<tag>`` (official or shipped
weights), ``<arch>`` (its default weights), ``local-dir:<folder>``, ``hf-hub:<owner>/<repo>``, a
``save_pretrained`` folder, a checkpoint file -- and, as ``ckpt_path=`` always took, ``last`` or a
``train.py`` run folder. ``ckpt_path=`` is the same key under its older name; both together load the
file into the registered architecture ``model=`` names (an authors' checkpoint, remapped by the tag's rules).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torch import nn

from aggzoo.errors import CheckpointNotFoundError, ConfigError, UnknownModelError
from aggzoo.evaluation.protocol import EvalProtocol
from aggzoo.hub.cfg import PretrainedCfg, split_name
from aggzoo.hub.factory import create_model, get_pretrained_cfg, is_model, model_entrypoint
from aggzoo.training.checkpointing import resolve_ckpt_path

__all__ = ["ModelToEvaluate", "command_line_keys", "load_model_to_evaluate", "model_spec", "model_to_evaluate",
           "normalisation", "refuse_ignored_overrides"]

log = logging.getLogger(__name__)

_CHECKPOINT_SUFFIXES = (".ckpt", ".pth", ".pt", ".safetensors", ".bin")


def command_line_keys() -> set[str]:
    """The config keys set on the command line (Hydra's task overrides, ``+``/``++``/``~`` stripped);
    empty outside a Hydra run (a config composed by hand states no command line)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return set()
    keys = set()
    for override in HydraConfig.get().overrides.task:
        keys.add(str(override).lstrip("+~").split("=", 1)[0].strip())
    return keys


def refuse_ignored_overrides(cfg: DictConfig) -> None:
    """A model given by name or file carries its own architecture, so ``head=`` / ``backbone=`` (or any
    ``head.*`` / ``backbone.*``) beside it would be silently ignored: refuse, naming them."""
    given = "model" if cfg.get("model") else "ckpt_path" if cfg.get("ckpt_path") else None
    if given is None:
        return
    ignored = sorted(k for k in command_line_keys() if k.split(".", 1)[0] in ("head", "backbone"))
    if ignored:
        raise ConfigError(
            f"{given}={cfg.get(given)} brings its own backbone and head (recorded with its weights), so "
            f"{', '.join(ignored)} would be ignored: drop {'it' if len(ignored) == 1 else 'them'}. To evaluate another "
            "architecture, name its weights (model=<arch>.<tag>, or a checkpoint trained with that head); to evaluate "
            "an untrained head=/backbone=, give neither model= nor ckpt_path=")


def model_to_evaluate(name: str, train_runs: Path, key: str = "ckpt_path") -> str:
    """What ``model=`` / ``ckpt_path=`` names, as :func:`create_model` takes it: ``last`` (the newest
    ``last.ckpt`` of the training runs under ``train_runs``), a run folder (its last checkpoint), a
    checkpoint file, a ``save_pretrained`` folder, ``local-dir:`` / ``hf-hub:``, or a registered name."""
    if name.startswith(("local-dir:", "hf-hub:")) or is_model(name):
        return name
    if name == "last":
        return str(resolve_ckpt_path("last", search_root=train_runs))
    path = Path(name).expanduser()
    if path.is_dir() and ((path / "checkpoints").is_dir() or (path / "last.ckpt").is_file()):
        return str(resolve_ckpt_path(path, search_root=train_runs))  # a run folder
    if path.is_dir() and not (path / "config.json").is_file():
        raise CheckpointNotFoundError(
            f"{key}={name} is a folder, but neither a run folder (checkpoints/last.ckpt) nor a folder written "
            f"by save_pretrained (config.json, model.safetensors); pass the checkpoint file, e.g. "
            f"{key}=<run>/checkpoints/last.ckpt")
    if not path.exists():
        if "/" not in name and not name.startswith((".", "~")) and path.suffix not in _CHECKPOINT_SUFFIXES:
            raise UnknownModelError(_unknown_name(name, key))
        raise CheckpointNotFoundError(
            f"{key}={name}: no such file or folder. Pass a checkpoint file (<run>/checkpoints/last.ckpt), "
            f"a run folder, {key}=last (the newest training run), a save_pretrained folder, or a registered "
            "name (python -m aggzoo.cli.models lists them)")
    return str(path)


def _unknown_name(name: str, key: str) -> str:
    """The registry's own message (with its did-you-mean), prefixed by the setting."""
    try:
        model_entrypoint(split_name(name)[0])
        get_pretrained_cfg(name)
        reason = f"unknown model {name!r}"  # pragma: no cover - is_model said no, so one of the two raises
    except UnknownModelError as err:
        reason = str(err)
    return (f"{key}={name}: {reason} (python -m aggzoo.cli.models lists the names; a file or folder of that name "
            "does not exist either)")


@dataclass
class ModelToEvaluate:
    """The model an eval config names, with where it came from and its pretrained cfg (if any)."""

    model: nn.Module
    name: str
    pretrained_cfg: PretrainedCfg | None

    @property
    def architecture(self) -> str | None:
        return getattr(self.model, "aggzoo_architecture", None) or (
            self.pretrained_cfg.architecture if self.pretrained_cfg is not None else None) or None

    @property
    def tag(self) -> str | None:
        return (self.pretrained_cfg.tag or None) if self.pretrained_cfg is not None else None

    def meta(self, protocol: EvalProtocol) -> dict[str, Any]:
        """What ``results.json`` / ``predictions.json`` record about the model and the protocol."""
        cfg = self.pretrained_cfg
        return {"model": self.name, "architecture": self.architecture, "tag": self.tag,
                "weights": cfg.source if cfg is not None and cfg.has_weights else None,
                "paper": cfg.paper if cfg is not None else None, "protocol": protocol.to_dict(),
                "published": dict(cfg.metrics) if cfg is not None else {}}


def load_model_to_evaluate(cfg: DictConfig) -> ModelToEvaluate | None:
    """The model of ``model=`` and/or ``ckpt_path=`` (``None`` when neither is given: the config's
    untrained backbone + head). Weights are always loaded; nothing in a file chooses code to run.
    A file that cannot be used is reported before any override it would make moot."""
    name, ckpt = cfg.get("model"), cfg.get("ckpt_path")
    train_runs = Path(cfg.paths.log_dir) / "train"
    if not name and not ckpt:
        return None
    if name and ckpt:
        # A registered architecture + a file: the file's weights in that architecture (e.g. the authors'
        # checkpoint through the tag's key rules); anything else would name two models.
        if not is_model(str(name)):
            raise ConfigError(f"model={name} and ckpt_path={ckpt} name two models; give one of them (ckpt_path= with "
                              "model= is for loading a file into a registered architecture, model=<arch>[.<tag>])")
        path = Path(model_to_evaluate(str(ckpt), train_runs))
        model = create_model(str(name), checkpoint_path=path)
        refuse_ignored_overrides(cfg)
        return ModelToEvaluate(model, f"{name} + {path}", getattr(model, "pretrained_cfg", None))
    asked = str(name or ckpt)
    resolved = model_to_evaluate(asked, train_runs, key="model" if name else "ckpt_path")
    # A registered name means its weights (the architecture's default tag when no tag is given).
    model = create_model(resolved, pretrained=is_model(resolved))
    refuse_ignored_overrides(cfg)
    return ModelToEvaluate(model, asked, getattr(model, "pretrained_cfg", None))


def model_spec(cfg: DictConfig) -> dict[str, Any]:
    """The model spec of a run config: its ``backbone`` and ``head`` nodes, resolved to plain data
    (built by :func:`aggzoo.hub.builder.build_model`, stored in every checkpoint)."""
    return {"backbone": OmegaConf.to_container(cfg.backbone, resolve=True),
            "head": OmegaConf.to_container(cfg.head, resolve=True)}


def normalisation(model: nn.Module) -> dict[str, Any]:
    """``{"mean", "std"}`` of the model's backbone (its timm pretrained cfg; ImageNet's when it states none)."""
    cfg = getattr(getattr(model, "backbone", None), "pretrained_cfg", {}) or {}
    return {"mean": tuple(cfg.get("mean", IMAGENET_DEFAULT_MEAN)), "std": tuple(cfg.get("std", IMAGENET_DEFAULT_STD))}
