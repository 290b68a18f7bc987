"""``eval.py model=<name>``: which model an eval config names, the protocol it is evaluated with, and
the unlabelled mode (``database=<folder> queries=<folder>``).

A name is anything :func:`aggzoo.create_model` takes -- ``<arch>.<tag>`` (official or shipped
weights), ``<arch>`` (its default weights), ``local-dir:<folder>``, ``hf-hub:<owner>/<repo>``, a
``save_pretrained`` folder, a checkpoint file -- and, as ``ckpt_path=`` always took, ``last`` or a
``train.py`` run folder. ``ckpt_path=`` is the same key under its older name; both together load the
file into the registered architecture ``model=`` names (an authors' checkpoint, remapped by the tag's rules).

The protocol (:class:`~aggzoo.evaluation.protocol.EvalProtocol`) comes from the weights'
:class:`~aggzoo.hub.cfg.PretrainedCfg` when they have one (how their metrics were measured), else from
the config (``image_size``, the pipeline resize, the backbone's normalisation, as before); any
``evaluation.<field>`` of :data:`PROTOCOL_KEYS` that is not null overrides it.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from PIL import Image
from torch import nn

from aggzoo.data.image_policy import SKIPPED_LIST_NAME, ImagePolicy
from aggzoo.data.retrieval_set import RetrievalSet
from aggzoo.errors import CheckpointNotFoundError, ConfigError, ImageReadError, UnknownModelError
from aggzoo.evaluation.protocol import EvalProtocol
from aggzoo.evaluation.unlabelled import Predictions, image_folder, predict, readable_images, write_predictions
from aggzoo.hub.cfg import PretrainedCfg, split_name
from aggzoo.hub.factory import create_model, get_pretrained_cfg, is_model, model_entrypoint
from aggzoo.models.input_size import size_multiple
from aggzoo.training.checkpointing import resolve_ckpt_path

__all__ = ["PROTOCOL_KEYS", "ModelToEvaluate", "command_line_keys", "evaluation_protocol", "load_model_to_evaluate",
           "model_to_evaluate", "preflight_size", "refuse_ignored_overrides", "run_unlabelled", "unlabelled_requested"]

log = logging.getLogger(__name__)

#: ``evaluation.<key>`` -> :class:`EvalProtocol` field (null: the model's own value)
PROTOCOL_KEYS = {"image_size": "image_size", "protocol_resize": "resize", "interpolation": "interpolation",
                 "mean": "mean", "std": "std", "descriptor_dim": "descriptor_dim", "metric": "metric",
                 "whitening_kind": "whitening_kind"}
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


def evaluation_protocol(model: nn.Module, cfg: DictConfig, pretrained_cfg: PretrainedCfg | None,
                        normalisation: dict[str, Any]) -> EvalProtocol:
    """The protocol ``model`` is evaluated with: its weights' cfg (or, without one, ``image_size`` with
    the pipeline resize and ``normalisation``), with every non-null ``evaluation.<key>`` of
    :data:`PROTOCOL_KEYS` applied; ``image_size=`` given on the command line counts as ``evaluation.image_size``."""
    multiple = size_multiple(model)
    if pretrained_cfg is not None:
        base = EvalProtocol.from_pretrained_cfg(pretrained_cfg, multiple=multiple)
    else:
        base = EvalProtocol(image_size=tuple(int(s) for s in cfg.image_size), resize="pipeline",
                            mean=tuple(normalisation["mean"]), std=tuple(normalisation["std"]), multiple=multiple,
                            source="the config (image_size, the backbone's normalisation): the model states no protocol")
    node = OmegaConf.to_container(cfg.get("evaluation") or {}, resolve=True)
    overrides = {field: node.get(key) for key, field in PROTOCOL_KEYS.items()}
    if overrides["resize"] is not None:
        overrides["resize"] = "protocol" if overrides["resize"] else "pipeline"
    if overrides["image_size"] is None and pretrained_cfg is not None and "image_size" in command_line_keys():
        overrides["image_size"] = OmegaConf.to_container(cfg.image_size) if not isinstance(cfg.image_size, int) \
            else cfg.image_size
    protocol = base.overridden_by(overrides)
    out_dim = getattr(model, "out_dim", None)
    if protocol.descriptor_dim is not None and isinstance(out_dim, int) and out_dim != protocol.descriptor_dim:
        where = "evaluation.descriptor_dim" if "descriptor_dim" in protocol.overridden else protocol.source
        raise ConfigError(f"the model gives {out_dim}-D descriptors but {where} states {protocol.descriptor_dim}; "
                          "evaluate the weights the protocol was written for, or set evaluation.descriptor_dim=null")
    if protocol.descriptor_dim is None and isinstance(out_dim, int):
        protocol = replace(protocol, descriptor_dim=out_dim)
    return protocol


def preflight_size(protocol: EvalProtocol, sets: Mapping[str, RetrievalSet]) -> tuple[int, int]:
    """The ``(H, W)`` the preflight runs the model at: the protocol's, or under a short side the size
    the first database image is resized to (its header read, not its pixels)."""
    if protocol.fixed_size:
        return protocol.output_size(0, 0)
    first = next((s.database_paths[0] for s in sets.values() if s.database_paths), None)
    if first is None:
        return protocol.output_size(int(protocol.image_size), int(protocol.image_size))
    with Image.open(first) as image:
        width, height = image.size
    return protocol.output_size(height, width)


def unlabelled_requested(cfg: DictConfig) -> bool:
    """``database=`` or ``queries=`` set: retrieval without ground truth instead of the benchmarks."""
    return bool(cfg.get("database") or cfg.get("queries"))


def _enum_value(value: Any) -> str:
    return str(getattr(value, "value", value))  # a schema-typed key arrives as its Enum


def run_unlabelled(cfg: DictConfig, model: nn.Module, protocol: EvalProtocol, meta: dict[str, Any],
                   device: Any) -> Predictions:
    """Top-``top_k`` of every image of ``queries=`` among ``database=`` (no ground truth), written to
    the run folder as ``predictions.csv`` / ``.json`` / ``.png``."""
    if "benchmark" in command_line_keys():
        raise ConfigError("benchmark= and database=/queries= are two evaluations: a benchmark has ground truth, the "
                          "folders have none (their top-k predictions are written); give one of them")
    database = image_folder(cfg.get("database"), "database")
    queries = image_folder(cfg.get("queries"), "queries")
    options = OmegaConf.to_container(cfg.evaluation, resolve=True)
    skipped_note = ""
    if _enum_value(cfg.get("bad_images", "fail")) == "skip":  # unreadable files leave both folders' lists
        policy = ImagePolicy("skip", log_path=Path(cfg.paths.output_dir) / SKIPPED_LIST_NAME)
        database = readable_images(database, policy, num_workers=cfg.num_workers, progress=options.get("progress"))
        queries = readable_images(queries, policy, num_workers=cfg.num_workers, progress=options.get("progress"))
        if not database or not queries:
            raise ImageReadError(f"bad_images=skip: no readable image left in {'database' if not database else 'queries'}"
                                 f"={cfg.database if not database else cfg.queries} (the unreadable ones are listed in "
                                 f"{policy.log_path})")
        if skipped := policy.finalize():
            skipped_note = f"note: skipped {len(skipped)} unreadable images (bad_images=skip); listed in {policy.log_path}"
    search = {key: options.get(key) for key in ("index", "search_params", "use_gpu", "refine")}
    search["index"] = search["index"] or "Flat"
    predictions = predict(model.to(device), database, queries, protocol.transform(), k=int(cfg.top_k),
                          refine_store=options.get("refine_store") or "ram", metric=protocol.metric,
                          self_matches=_enum_value(cfg.get("self_matches", "report")),
                          batch_size=int(cfg.eval_batch_size) if protocol.fixed_size else 1,
                          num_workers=cfg.num_workers, device=device, progress=options.get("progress"), **search)
    files = write_predictions(predictions, cfg.paths.output_dir,
                              meta={**meta, "database": str(cfg.database), "queries": str(cfg.queries)},
                              picture=bool(options.get("pictures", True)),
                              grid_queries=int(options.get("grid_queries", 6)),
                              # the picture shows the top_k asked for, unless its own width is given
                              grid_k=int(options["grid_k"]) if "evaluation.grid_k" in command_line_keys() else int(cfg.top_k))
    if skipped_note:
        print(skipped_note)
    summary = predictions.summary()
    found = summary["queries_that_found_their_own_file"]
    if found:  # a query finding its own file says nothing about the model: never a plain success line
        print(f"warning: {found} of {len(queries)} queries found their own image file among the database images "
              f"({summary['queries_whose_top1_is_their_own_file']} of them at top-1): queries={cfg.queries} and "
              f"database={cfg.database} share {summary['queries_in_database']} files. The figures below count those "
              "self-matches; search each query without its own file with self_matches=exclude, or give a query "
              "folder outside the database folder", file=sys.stderr)
    distance = (f"; top-1 median {summary['median_top1_distance_m']:.1f} m from the query (file-name coordinates), "
                f"{100 * summary['top1_within_25m']:.1f} % within 25 m" if predictions.distances_m is not None else "")
    if found:
        distance += f" (counting {found} queries that found their own file: not a measure of the model)"
    elif summary["queries_in_database"]:
        distance += f" ({summary['queries_in_database']} queries searched without their own file: self_matches=exclude)"
    print(f"{len(queries)} queries x {len(database)} database images, top-{summary['k']} written to "
          f"{files['csv']} and {files['json']}{distance}")
    return predictions
