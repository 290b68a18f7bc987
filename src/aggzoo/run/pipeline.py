"""``train(cfg)``: the training job, importable and testable without ``@hydra.main`` (the evaluation job is
:func:`aggzoo.run.evaluate.evaluate`), and :func:`compose_run_config` to compose either job's config from Python.

The entry points ``train.py`` / ``eval.py`` only compose the config and call these.
"""

from __future__ import annotations

import inspect
import json
import logging
import signal
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import lightning.pytorch as L
import torch
from hydra.utils import instantiate
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf, open_dict

from aggzoo.data.place_split import val_split_from_config
from aggzoo.data.retrieval_set import RetrievalSet
from aggzoo.data.transforms import eval_transform, train_transform
from aggzoo.errors import ConfigError, RunFolderError, UserError
from aggzoo.evaluation.loop import evaluate_retrieval
from aggzoo.evaluation.options import EvaluationOptions, ExtractionOptions
from aggzoo.evaluation.report import format_table, to_json, write_json_document
from aggzoo.evaluation.result import RetrievalResult
from aggzoo.hub.checkpoint import SPEC_KEY, read_checkpoint
from aggzoo.hub.factory import create_model, is_model
from aggzoo.models.vpr_model import VPRModel
from aggzoo.run.benchmark_config import load_benchmarks
from aggzoo.run.evaluation_keys import migrate_overrides
from aggzoo.run.model_by_name import model_spec, model_to_evaluate, normalisation
from aggzoo.run.preflight import after_training, before_training, build_model_checked, check_config, result_notes
from aggzoo.run.resume import resume_config, saved_overrides
from aggzoo.run.run_folder import (
    discard_unused_run_folder,
    hold_run_folder,
    release_run_folder,
    unwritable_folder_message,
)
from aggzoo.run.train_report import NO_TRAINING_NOTE, closing_for, trained_row_label
from aggzoo.training.callbacks import UntrainedBaseline
from aggzoo.training.checkpointing import check_checkpoint_matches, resolve_ckpt_path, run_dir_of
from aggzoo.training.clique_mining import CliqueMiningOptions
from aggzoo.training.datamodule import VPRDataModule
from aggzoo.training.interrupt import StoppedByCtrlC
from aggzoo.training.module import VPRLightningModule
from aggzoo.training.timing import StepTimer

__all__ = ["TrainingParts", "build_loss", "build_training", "clique_mining_options", "compose_run_config",
           "module_options", "train"]

log = logging.getLogger(__name__)


def _evaluate_all(model: VPRModel, sets: Mapping[str, RetrievalSet], transform: Any, cfg: DictConfig,
                  device: torch.device) -> list[RetrievalResult]:
    options = EvaluationOptions(ks=tuple(cfg.recall_ks), extraction=ExtractionOptions(
        batch_size=int(cfg.eval_batch_size), num_workers=cfg.num_workers, device=str(device)))
    return [evaluate_retrieval(model, retrieval_set, transform, options) for retrieval_set in sets.values()]


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class _ModelConfigInCheckpoint(L.Callback):
    """Stores the backbone + head config in every checkpoint, so ``eval.py ckpt_path=...`` and
    the hub API rebuild the model without being told its architecture again."""

    def __init__(self, model_cfg: dict[str, Any]) -> None:
        self.model_cfg = model_cfg

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        checkpoint[SPEC_KEY] = self.model_cfg


@dataclass
class TrainingParts:
    """What :func:`build_training` assembles from a train config."""

    model: VPRModel
    module: VPRLightningModule
    datamodule: VPRDataModule
    test_sets: dict[str, RetrievalSet]
    test_transform: Any


def build_training(cfg: DictConfig, model_cfg: Mapping[str, Any] | None = None) -> TrainingParts:
    """Model, LightningModule and data module of a train config (no trainer, no callbacks): what
    :func:`train` runs, and what ``benchmarks/train_throughput.py`` times against a plain loop."""
    model = build_model_checked(model_cfg if model_cfg is not None else model_spec(cfg))
    norm = normalisation(model)
    data = cfg.data
    # A recipe may name its own augmentation (data.augmentation, e.g. RandAugment); else the default.
    augmentation = instantiate(data.augmentation) if data.get("augmentation") else None
    augment = (augmentation(data.image_size, **norm) if augmentation is not None
               else train_transform(data.image_size, **norm, strength=data.augment_strength))
    train_dataset = instantiate(data.train)(transform=augment)
    test_transform = eval_transform(data.eval_image_size, **norm)
    val_sets = load_benchmarks(cfg.get("val_benchmarks"))
    if data.get("val_split"):  # validation places carved off the training data (data/place_split.py); first = monitored
        held = val_split_from_config(train_dataset, OmegaConf.to_container(data.val_split, resolve=True))
        val_sets = {held.name: held, **val_sets}
    test_sets = load_benchmarks(cfg.get("test_benchmarks"))
    datamodule = VPRDataModule(train_dataset=train_dataset, val_sets=val_sets, eval_transform=test_transform,
                               places_per_batch=data.places_per_batch, num_workers=data.num_workers,
                               eval_batch_size=cfg.eval_batch_size, seed=cfg.seed,
                               clique_mining=clique_mining_options(cfg))
    supplied = {
        "loss": build_loss(cfg.loss, train_dataset, model), "optimizer": instantiate(cfg.optimizer),
        "scheduler": instantiate(cfg.scheduler) if cfg.get("scheduler") else None,
        "val_sets": {name: (s.num_database, s.positives, s.queries_are_database) for name, s in val_sets.items()},
        "recall_ks": tuple(cfg.recall_ks),
    }
    module = VPRLightningModule(model, **supplied, **module_options(cfg, supplied=supplied.keys()))
    return TrainingParts(model, module, datamodule, test_sets, test_transform)


def build_loss(node: DictConfig, train_dataset: Any, model: VPRModel) -> torch.nn.Module:
    """``cfg.loss``, completed with the sizes from the data and the model when it is a ``partial``
    (a margin loss, ``conf/loss/arcface.yaml``: its class weights are ``[model.out_dim, num_classes]``,
    ``num_classes`` being the training set's number of classes)."""
    loss = instantiate(node)
    if not isinstance(loss, partial):
        return loss
    num_classes = getattr(train_dataset, "num_classes", None)
    if num_classes is None:
        raise ConfigError(f"loss={str(node.get('_target_', '?')).rsplit('.', 1)[-1]} is a classification loss: it needs "
                          f"a class-labelled training set (data=synthetic_landmarks, data=gldv2_clean, ...), not "
                          f"{type(train_dataset).__name__}; use a pair loss (loss=multisimilarity) with place data")
    return loss(num_classes=int(num_classes), embedding_size=int(model.out_dim))


def clique_mining_options(cfg: DictConfig) -> CliqueMiningOptions | None:
    """``data.clique_mining`` (``data/clique_mining=default``) as the data module's options, ``None`` when
    absent. ``descriptor_model`` is anything ``model=`` of ``eval.py`` takes (a registered ``<arch>.<tag>``,
    a checkpoint); it is checked now and built only where the pool is built (rank 0, at fit start)."""
    node = cfg.data.get("clique_mining")
    if not node:
        return None
    options = dict(OmegaConf.to_container(node, resolve=True))
    accepted = {f.name for f in fields(CliqueMiningOptions)}
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise ConfigError(f"data.clique_mining.{unknown[0]} is not an option of clique mining; it takes "
                          f"{sorted(accepted)} (aggzoo.training.clique_mining.CliqueMiningOptions)")
    name = options.pop("descriptor_model", None)
    if name:
        resolved = model_to_evaluate(str(name), Path(cfg.paths.log_dir) / "train", key="data.clique_mining.descriptor_model")
        options["descriptor_model"] = partial(create_model, resolved, pretrained=is_model(resolved))
    return CliqueMiningOptions(**options)


def module_options(cfg: DictConfig, *, supplied: Iterable[str] = ()) -> dict[str, Any]:
    """The ``model:`` node: keyword arguments of :class:`VPRLightningModule` that the recipe changes.

    The module's signature holds every default, once; the node states only what differs (empty in
    ``conf/train.yaml``), as a head's YAML states only what differs from its class. Override an
    option with ``+model.head_fp32=true`` (``+``: the key is not in the default node).
    """
    node = cfg.get("model")
    options: dict[str, Any] = dict(OmegaConf.to_container(node, resolve=True)) if node else {}
    accepted = set(inspect.signature(VPRLightningModule.__init__).parameters) - {"self", "model", *supplied}
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise ConfigError(f"model.{unknown[0]} is not an option of the training module; the model node takes "
                          f"{sorted(accepted)} (keyword arguments of aggzoo.training.module.VPRLightningModule, "
                          "whose signature holds their defaults)")
    return options


def compose_run_config(config_dir: str | Path, name: str, overrides: Sequence[str],
                       output_dir: str | Path) -> DictConfig:
    """``<config_dir>/<name>.yaml`` with ``overrides``, composed as ``@hydra.main`` does, for calling
    :func:`train` / :func:`evaluate` from Python (tests, benchmarks, notebooks).

    ``${hydra:...}`` interpolations resolve as in a run; the run folder is ``output_dir`` and
    ``paths.root_dir`` the folder that holds ``config_dir``; the ``hydra`` node is then dropped.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    config_dir = Path(config_dir).resolve()
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(config_dir), version_base="1.3"):
        cfg = compose(name, overrides=migrate_overrides(overrides), return_hydra_config=True)
    HydraConfig().set_config(cfg)
    with open_dict(cfg):
        cfg.paths.output_dir = str(output_dir)
        cfg.paths.root_dir = str(config_dir.parent)
        del cfg.hydra
    return cfg


def train(cfg: DictConfig) -> dict[str, Any]:
    """Train ``cfg.backbone`` + ``cfg.head`` on ``cfg.data``, validate on ``cfg.val_benchmarks``
    each epoch, then evaluate the best checkpoint and the untrained model on ``cfg.test_benchmarks``.

    ``ckpt_path`` (``last``, a run folder or a ``.ckpt`` file) resumes a run in its own folder,
    with its optimiser, scheduler, sampler position and RNG streams. The run folder receives
    ``checkpoints/``, logs, ``test_results.json`` and ``run_summary.json`` (read by
    ``python -m aggzoo.run.collect_runs``).

    ``ckpt_path`` of a run folder resumes with that run's own config (:mod:`aggzoo.run.resume`: its
    saved overrides replayed on aggzoo's conf/, an override given now must agree), holding the
    folder so that no second live run writes into it (:func:`aggzoo.run.run_folder.hold_run_folder`);
    the folder Hydra made for the resuming command is then removed, its log moved into the run.
    ``run_summary.json`` is written as soon as the untrained baseline is measured (a run killed later
    keeps those rows; a resumed run carries them over) and again at the end. A failed start
    (a :class:`~aggzoo.errors.UserError` before anything of the run is written) leaves no run folder.

    Returns a dict with the trainer, the best checkpoint path and the test results.
    """
    launch_dir = Path(cfg.paths.output_dir)  # the folder Hydra made for this command (or the caller's)
    held: list[Path] = []
    try:
        return _train(cfg, launch_dir, held)
    except UserError:
        if not _sweep_job():  # a sweep lists its failed jobs (run_error.txt, aggzoo.run.sweep)
            discard_unused_run_folder(launch_dir)  # nothing of the run in it: not a run for collect_runs
        raise
    finally:
        for folder in held:
            release_run_folder(folder)


def _sweep_job() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def _train(cfg: DictConfig, launch_dir: Path, held: list[Path]) -> dict[str, Any]:
    started = time.perf_counter()
    ckpt_path = resolve_ckpt_path(cfg.get("ckpt_path"), search_root=Path(cfg.paths.log_dir) / str(cfg.task_name),
                                  own_dir=launch_dir)
    kept = KeptRows({}, [])
    resumed_dir = run_dir_of(ckpt_path) if ckpt_path is not None else None
    if resumed_dir is not None:
        # Continue in the interrupted run's folder: its checkpoint callback state (best model) stays
        # valid and the run keeps one folder of checkpoints and results.
        if (problem := unwritable_folder_message(resumed_dir)) is not None:
            raise RunFolderError(
                f"{problem}. A resumed run continues in its own folder: make it writable, or copy {ckpt_path.name} "
                "out of its checkpoints/ folder and resume from the copy (ckpt_path=<copy>) to continue in a new run folder")
        with open_dict(cfg):
            cfg.paths.output_dir = str(resumed_dir)
        cfg = resume_config(cfg, resumed_dir)
        kept = KeptRows(_baseline_rows_of(resumed_dir / "run_summary.json"),
                        _baseline_results_of(resumed_dir / "run_summary.json"))
    # The one safe reader, before anything is built: a file that needs code to load, or whose recorded
    # spec names anything but aggzoo's model classes, is refused here, long before Lightning opens it
    # (and before anything is written into its run's folder).
    stored = read_checkpoint(ckpt_path) if ckpt_path is not None else None
    if resumed_dir is not None and resumed_dir.resolve() != launch_dir.resolve():
        held.append(hold_run_folder(resumed_dir))  # one live run per folder
        if not _sweep_job():
            discard_unused_run_folder(launch_dir, keep_log_in=resumed_dir)
        log.info("resuming %s in %s", ckpt_path, resumed_dir)
    check_config(cfg, "train")
    L.seed_everything(cfg.seed, workers=True)
    model_cfg = model_spec(cfg)
    parts = build_training(cfg, model_cfg)
    model, module, datamodule = parts.model, parts.module, parts.datamodule
    if stored is not None:
        check_checkpoint_matches(stored, module, model_cfg)  # keys and shapes, before the preflight
        stored = None  # Lightning reads the file again itself; do not hold a second copy while training
    image_policy = before_training(cfg, parts)  # bad_images policy + preflight checks, before any training
    test_sets, test_transform, data = parts.test_sets, parts.test_transform, cfg.data

    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c is not None]
    callbacks.append(_ModelConfigInCheckpoint(model_cfg))
    timer = StepTimer()
    callbacks.append(timer)
    baseline = UntrainedBaseline(test_sets, test_transform, recall_ks=tuple(cfg.recall_ks),
                                 batch_size=cfg.eval_batch_size, num_workers=data.num_workers)
    if cfg.evaluate_baseline and test_sets:
        callbacks.append(baseline)
    out_dir = Path(cfg.paths.output_dir)

    def summarise(status: str, rows: list[tuple[str, list[RetrievalResult]]], best: Path | None = None) -> None:
        _write_run_summary(out_dir / "run_summary.json", cfg, trainer, rows, best,
                           time.perf_counter() - started, status=status, kept=kept)

    # Written as soon as the baseline is measured (UntrainedBaseline runs first at train start).
    callbacks.append(_SummaryAtTrainStart(lambda: summarise(RUNNING, _baseline_rows(baseline))))
    loggers = [instantiate(lg) for lg in (cfg.get("logger") or {}).values() if lg is not None]
    trainer: L.Trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)

    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=str(ckpt_path) if ckpt_path is not None else None)
    except (SIGTERMException, StoppedByCtrlC) as stop:
        # GracefulInterrupt has saved the checkpoint; report it, then exit as a signalled process does.
        stopped = after_training(trainer, image_policy)
        _summarise_interrupted(summarise, trainer, baseline, stopped)
        raise SystemExit(128 + (signal.SIGTERM if isinstance(stop, SIGTERMException) else signal.SIGINT)) from None
    best = _best_checkpoint(trainer)
    results: dict[str, Any] = {"best_checkpoint": str(best) if best else None, "trainer": trainer}
    results.update(after_training(trainer, image_policy))  # skipped images; a Ctrl-C stop skips the tests
    if "interrupted" in results:  # Ctrl-C in an epoch's last step: stopped at its end, saved
        _summarise_interrupted(summarise, trainer, baseline, results)
        raise SystemExit(128 + signal.SIGINT)
    if not trainer.is_global_zero:  # rank 0 alone evaluates the test sets and writes the results
        return results
    if best is not None:
        # The one reader, for our own file too; it applies weight ensembling where the file records it.
        stored = read_checkpoint(best)
        module.model.load_state_dict(stored.state_dict())
        if stored.ensembling_alpha is not None:
            log.info("testing the weight ensemble of %s: alpha=%g", best.name, stored.ensembling_alpha)
    table_rows: list[tuple[str, list[RetrievalResult]]] = []
    if test_sets:
        if trainer.global_step == 0:
            print(NO_TRAINING_NOTE)  # max_epochs=0: what follows must not be called trained
        trained = _evaluate_all(model, test_sets, test_transform, cfg, _device())
        results["test"] = trained
        # With no training step the tested model is the untrained one: no separate untrained row then.
        baseline_rows = [row for row in _baseline_rows(baseline) if trainer.global_step > 0 or row[0] != "untrained"]
        table_rows = [*baseline_rows, (trained_row_label(trainer.global_step), trained)]
        if baseline.results and trainer.global_step > 0:
            results["baseline"] = baseline.results
        if baseline.pooling_results:
            results["baseline_global_pooling"] = baseline.pooling_results
        chosen = bool(getattr(trainer.checkpoint_callback, "best_model_path", "")
                      and getattr(trainer.checkpoint_callback, "monitor", None))
        print(_comparison_table(table_rows, chosen_on_validation=chosen))
        if notes := result_notes(trained):
            print("\n".join(notes))
        document = to_json([r for _, rs in table_rows for r in rs],
                           labels=[label for label, rs in table_rows for _ in rs])  # as run_summary.json names them
        document["results"] = [*kept.rows, *document["results"]]  # a resumed run's baseline rows, measured before
        write_json_document(document, out_dir / "test_results.json")
    results["seconds"] = time.perf_counter() - started
    summarise(DONE, table_rows, best)
    print("\n".join(closing_for(cfg, trainer, out_dir)))  # where everything is, and the command to run next
    log.info("train job finished in %.1f s", results["seconds"])
    return results


class KeptRows(NamedTuple):
    """The baseline rows of an earlier ``run_summary.json`` of the same run, which a resumed run does not
    measure again: ``test`` as the summary's ``test`` holds them, ``rows`` with every field (``test_results.json``)."""

    test: dict[str, Any]
    rows: list[dict[str, Any]]


#: ``status`` of a ``run_summary.json``: written at train start (baseline rows only) / at the end
RUNNING = "running or killed (no trained results yet)"
DONE = "done"
_BASELINE_LABELS = ("pooling_baseline", "untrained")


class _SummaryAtTrainStart(L.Callback):
    """Calls ``write()`` at train start on rank 0, after the callbacks before it (the baseline)."""

    def __init__(self, write: Any) -> None:
        self.write = write

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            self.write()


def _baseline_rows(baseline: UntrainedBaseline) -> list[tuple[str, list[RetrievalResult]]]:
    """The baseline rows measured in this process, in the table's order."""
    return [(label, rs) for label, rs in (("pooling_baseline", baseline.pooling_results),
                                           ("untrained", baseline.results)) if rs]


def _baseline_rows_of(summary: Path) -> dict[str, Any]:
    """The baseline rows a run's earlier ``run_summary.json`` holds (a resumed run does not measure them again)."""
    try:
        test = json.loads(summary.read_text()).get("test", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return {label: test[label] for label in _BASELINE_LABELS if isinstance(test, dict) and label in test}


def _baseline_results_of(summary: Path) -> list[dict[str, Any]]:
    """The baseline rows (every field) of a run's earlier ``run_summary.json``, as test_results.json holds them."""
    try:
        rows = json.loads(summary.read_text()).get("test_results", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [row for row in rows if isinstance(row, dict) and row.get("label") in _BASELINE_LABELS] \
        if isinstance(rows, list) else []


def _summarise_interrupted(summarise: Any, trainer: L.Trainer, baseline: UntrainedBaseline,
                           stopped: dict[str, Any]) -> None:
    if trainer.is_global_zero and "interrupted" in stopped:
        summarise(f"interrupted at global step {trainer.global_step}: resume with ckpt_path={stopped['interrupted']}",
                  _baseline_rows(baseline))


def _write_run_summary(path: Path, cfg: DictConfig, trainer: L.Trainer,
                       table_rows: list[tuple[str, list[RetrievalResult]]], best: Path | None, seconds: float, *,
                       status: str = DONE, kept: KeptRows | None = None) -> None:
    """One JSON per run with what a sweep comparison needs (``aggzoo.run.collect_runs``): the trainer's model
    and its step timer (:class:`~aggzoo.training.timing.StepTimer`), the test rows, and ``kept``: the rows of an
    earlier summary of the same run that this process did not measure (a resume's baseline)."""
    model = trainer.lightning_module.model
    timer = next(c for c in trainer.callbacks if isinstance(c, StepTimer))
    from hydra.core.hydra_config import HydraConfig

    overrides: list[str] = []
    choices: dict[str, Any] = {}
    if HydraConfig.initialized():
        hydra_cfg = HydraConfig.get()
        overrides = list(hydra_cfg.overrides.task)
        choices = dict(hydra_cfg.runtime.choices)
    # The run folder's own record wins: a resumed run's overrides are the run's, not the resuming command's.
    recorded = path.parent / ".hydra" / "hydra.yaml"
    if (saved := saved_overrides(path.parent)) is not None and recorded.is_file():
        overrides = saved
        choices = dict(OmegaConf.select(OmegaConf.load(recorded), "hydra.runtime.choices", default={}) or {})
    head_class = str(cfg.head.get("_target_", "")).rsplit(".", 1)[-1]
    timing = timer.summary()
    images_per_step = int(cfg.data.places_per_batch) * int(getattr(trainer.datamodule.train_dataset, "img_per_place", 1))
    if getattr(trainer.datamodule, "clique_mining", None) is not None:
        images_per_step *= 2  # a clique batch beside the places
    summary = {
        "overrides": overrides,
        "backbone": cfg.backbone.get("model_name", cfg.backbone.get("_target_")),
        # the conf/head choice (afa and ida share AFA's code), else the class
        "head": choices.get("head") or head_class, "head_class": head_class,
        "descriptor_dim": int(model.out_dim),
        "params": sum(p.numel() for p in model.parameters()),
        "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "image_size": list(cfg.data.image_size), "eval_image_size": list(cfg.data.eval_image_size),
        "images_per_step": images_per_step,
        **timing,
        "images_per_second": images_per_step / timing["seconds_per_step"] if timing["seconds_per_step"] else None,
        "epochs": trainer.current_epoch, "global_step": trainer.global_step,
        "val": {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")},
        "test": {**(kept.test if kept else {}),
                 **{label: {r.name: {str(k): v for k, v in r.recalls.items()} for r in rs} for label, rs in table_rows}},
        # the rows of test_results.json (every field), so that a resumed run writes its baseline rows there too
        "test_results": [*(kept.rows if kept else []), *to_json([r for _, rs in table_rows for r in rs],
                                                      labels=[label for label, rs in table_rows for _ in rs])["results"]],
        "best_checkpoint": str(best) if best else None,
        "wall_seconds": round(seconds, 1),
        "status": status,
    }
    path.write_text(json.dumps(summary, indent=2, default=lambda v: v.tolist() if hasattr(v, "tolist") else str(v)))


def _best_checkpoint(trainer: L.Trainer) -> Path | None:
    ckpt = trainer.checkpoint_callback
    if ckpt is None:
        return None
    path = ckpt.best_model_path or ckpt.last_model_path
    return Path(path) if path else None


#: Headings of the rows of the train job's test table (the keys are what run_summary.json stores).
_ROW_TITLES = {
    "pooling_baseline": "untrained backbone + global average pooling",
    "untrained": "untrained model (step 0, after any data-driven init)",
    "trained": "trained (best checkpoint)",
}


def _comparison_table(rows: list[tuple[str, list[RetrievalResult]]], *, chosen_on_validation: bool = True) -> str:
    titles = dict(_ROW_TITLES)
    if not chosen_on_validation:  # no validation set: ModelCheckpoint chose nothing, the last checkpoint was tested
        titles["trained"] = "trained (last checkpoint: no validation metric chose a best one)"
    lines = []
    for label, rs in rows:
        lines.append(f"== {titles.get(label, label)} ==")
        lines.append(format_table(rs))
    return "\n".join(lines)
