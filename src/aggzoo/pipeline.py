"""``train(cfg)`` and ``evaluate(cfg)``: the two jobs, importable and testable without ``@hydra.main``.

The entry points ``train.py`` / ``eval.py`` only compose the config and call these.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning.pytorch as L
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from aggzoo.data.retrieval_set import RetrievalSet
from aggzoo.data.transforms import eval_transform, train_transform
from aggzoo.evaluation.report import format_table, write_json
from aggzoo.evaluation.retrieval import RetrievalResult, evaluate_retrieval
from aggzoo.models.vpr_model import VPRModel
from aggzoo.training.callbacks import UntrainedBaseline
from aggzoo.training.datamodule import VPRDataModule
from aggzoo.training.module import VPRLightningModule

__all__ = ["build_model", "load_benchmarks", "train", "evaluate", "model_from_checkpoint"]

log = logging.getLogger(__name__)

#: Key under which a checkpoint stores the backbone + head config that rebuilds its model.
MODEL_CONFIG_KEY = "aggzoo_model_config"


def build_model(model_cfg: DictConfig | Mapping[str, Any]) -> VPRModel:
    """``{"backbone": <node>, "head": <node>}`` -> :class:`VPRModel`."""
    backbone = instantiate(model_cfg["backbone"])
    return VPRModel(backbone, instantiate(model_cfg["head"]))


def load_benchmarks(nodes: DictConfig | None) -> dict[str, RetrievalSet]:
    """``{name: loader node}`` (the ``benchmark`` config group) -> loaded retrieval sets."""
    return {str(name): instantiate(node) for name, node in (nodes or {}).items()}


def _normalisation(model: VPRModel) -> dict[str, Any]:
    cfg = getattr(model.backbone, "pretrained_cfg", {}) or {}
    return {"mean": tuple(cfg.get("mean", (0.485, 0.456, 0.406))), "std": tuple(cfg.get("std", (0.229, 0.224, 0.225)))}


def _evaluate_all(model: VPRModel, sets: Mapping[str, RetrievalSet], transform: Any, cfg: DictConfig,
                  device: torch.device) -> list[RetrievalResult]:
    return [evaluate_retrieval(model, retrieval_set, transform, ks=tuple(cfg.recall_ks),
                               batch_size=cfg.eval_batch_size, num_workers=cfg.num_workers, device=device)
            for retrieval_set in sets.values()]


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class _ModelConfigInCheckpoint(L.Callback):
    """Stores the backbone + head config in every checkpoint, so ``eval.py ckpt_path=...`` and
    the hub API rebuild the model without being told its architecture again."""

    def __init__(self, model_cfg: dict[str, Any]) -> None:
        self.model_cfg = model_cfg

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        checkpoint[MODEL_CONFIG_KEY] = self.model_cfg


def train(cfg: DictConfig) -> dict[str, Any]:
    """Train ``cfg.backbone`` + ``cfg.head`` on ``cfg.data``, validate on ``cfg.val_benchmarks``
    each epoch, then evaluate the best checkpoint and the untrained model on ``cfg.test_benchmarks``.

    Returns a dict with the trainer, the best checkpoint path and the test results.
    """
    started = time.perf_counter()
    L.seed_everything(cfg.seed, workers=True)
    model_cfg = {"backbone": OmegaConf.to_container(cfg.backbone, resolve=True),
                 "head": OmegaConf.to_container(cfg.head, resolve=True)}
    model = build_model(model_cfg)
    norm = _normalisation(model)
    data = cfg.data
    train_dataset = instantiate(data.train)(
        transform=train_transform(data.image_size, **norm, strength=data.augment_strength))
    test_transform = eval_transform(data.eval_image_size, **norm)
    val_sets = load_benchmarks(cfg.get("val_benchmarks"))
    test_sets = load_benchmarks(cfg.get("test_benchmarks"))
    datamodule = VPRDataModule(train_dataset=train_dataset, val_sets=val_sets, eval_transform=test_transform,
                               places_per_batch=data.places_per_batch, num_workers=data.num_workers,
                               eval_batch_size=cfg.eval_batch_size)
    loss = instantiate(cfg.loss)
    module = VPRLightningModule(
        model, loss=loss, optimizer=instantiate(cfg.optimizer),
        scheduler=instantiate(cfg.scheduler) if cfg.get("scheduler") else None,
        lr_multipliers=cfg.model.lr_multipliers, no_weight_decay=cfg.model.no_weight_decay,
        val_sets={name: (s.num_database, s.positives) for name, s in val_sets.items()},
        recall_ks=cfg.recall_ks)

    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c is not None]
    callbacks.append(_ModelConfigInCheckpoint(model_cfg))
    baseline = UntrainedBaseline(test_sets, test_transform, recall_ks=tuple(cfg.recall_ks),
                                 batch_size=cfg.eval_batch_size, num_workers=data.num_workers)
    if cfg.evaluate_baseline and test_sets:
        callbacks.append(baseline)
    loggers = [instantiate(lg) for lg in (cfg.get("logger") or {}).values() if lg is not None]
    trainer: L.Trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)

    ckpt_path = cfg.get("ckpt_path")
    trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
    best = _best_checkpoint(trainer)
    if best is not None:
        state = torch.load(best, map_location="cpu", weights_only=True)["state_dict"]
        module.load_state_dict(state)
    results: dict[str, Any] = {"best_checkpoint": str(best) if best else None}
    if test_sets:
        trained = _evaluate_all(model, test_sets, test_transform, cfg, _device())
        results["test"] = trained
        table_rows = [("trained", trained)]
        if baseline.results:
            results["baseline"] = baseline.results
            table_rows.insert(0, ("untrained", baseline.results))
        print(_comparison_table(table_rows))
        out_dir = Path(cfg.paths.output_dir)
        write_json([r for _, rs in table_rows for r in rs], out_dir / "test_results.json")
    log.info("train job finished in %.1f s", time.perf_counter() - started)
    results["trainer"] = trainer
    results["seconds"] = time.perf_counter() - started
    return results


def _best_checkpoint(trainer: L.Trainer) -> Path | None:
    ckpt = trainer.checkpoint_callback
    if ckpt is None:
        return None
    path = ckpt.best_model_path or ckpt.last_model_path
    return Path(path) if path else None


def _comparison_table(rows: list[tuple[str, list[RetrievalResult]]]) -> str:
    lines = []
    for label, rs in rows:
        lines.append(f"== {label} ==")
        lines.append(format_table(rs))
    return "\n".join(lines)


def model_from_checkpoint(path: str | Path) -> VPRModel:
    """Rebuild a model from a checkpoint written by :func:`train` (weights only, no pickled code)."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    if MODEL_CONFIG_KEY not in checkpoint:
        raise ValueError(f"{path} does not record its model config ({MODEL_CONFIG_KEY!r}); "
                         "it was not written by aggzoo's train.py — pass backbone=... head=... instead")
    model = build_model(checkpoint[MODEL_CONFIG_KEY])
    prefix = "model."
    state = {k[len(prefix):]: v for k, v in checkpoint["state_dict"].items() if k.startswith(prefix)}
    model.load_state_dict(state, strict=True)
    return model


def evaluate(cfg: DictConfig) -> list[RetrievalResult]:
    """Evaluate ``cfg.ckpt_path`` (or ``cfg.backbone`` + ``cfg.head`` untrained when it is null)
    on every benchmark in ``cfg.benchmark``; prints a table and writes JSON to the output dir."""
    if cfg.get("ckpt_path"):
        model = model_from_checkpoint(cfg.ckpt_path)
    else:
        model = build_model({"backbone": cfg.backbone, "head": cfg.head})
    transform = eval_transform(cfg.image_size, **_normalisation(model))
    sets = load_benchmarks(cfg.benchmark)
    if not sets:
        raise ValueError("no benchmark selected: pass benchmark=<name> or benchmark=[a,b] (see conf/benchmark/)")
    results = _evaluate_all(model, sets, transform, cfg, _device())
    print(format_table(results))
    write_json(results, Path(cfg.paths.output_dir) / "results.json")
    return results
