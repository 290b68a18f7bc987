"""Never lose a run: find the checkpoint to resume and check it fits the model.

- :func:`resolve_ckpt_path` turns ``ckpt_path=last`` (or a run folder) into a file: the run's own
  ``checkpoints/last.ckpt`` when it has one (a requeued SLURM job), else the newest ``last.ckpt``
  under the log folder.
- :class:`RunCheckpoint` is Lightning's ``ModelCheckpoint`` with ``last.ckpt`` always the newest state.
- :func:`check_checkpoint_matches` compares the checkpoint's weights with the configured model
  before Lightning touches them and raises one :class:`CheckpointMismatchError` that names the
  differing keys, both model configs and the fix.

Checkpoint files themselves are written atomically by
:class:`aggzoo.training.durable_io.DurableCheckpointIO` (``conf/trainer/default.yaml``), so a run
killed while saving keeps its previous ``last.ckpt``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

__all__ = ["CheckpointMismatchError", "RunCheckpoint", "check_checkpoint_matches", "resolve_ckpt_path", "run_dir_of"]

_LAST = ("last.ckpt", "last-v*.ckpt")


class RunCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` whose ``last.ckpt`` is refreshed at every save point (epoch or validation end).

    Lightning 2.6 writes ``last.ckpt`` only when a top-k checkpoint is written at the same step: with
    ``monitor=val/R@1``, an epoch that does not improve leaves ``last.ckpt`` at an older epoch, so a run
    killed later resumes from there and repeats epochs, and a finished run's ``last.ckpt`` is not its
    final state. The top-k checkpoints are chosen as before.
    """

    @property
    def state_key(self) -> str:
        # Lightning files a callback's state under its class name: keep ModelCheckpoint's, so that runs
        # checkpointed before this class existed resume with their best-model bookkeeping.
        return super().state_key.replace(type(self).__qualname__, ModelCheckpoint.__qualname__, 1)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if self._should_save_on_train_epoch_end(trainer):
            self._refresh_last(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if not self._should_save_on_train_epoch_end(trainer):
            self._refresh_last(trainer)

    def _refresh_last(self, trainer: L.Trainer) -> None:
        # Skipped when this step was saved already (by the top-k rule), in sanity checks and outside fit.
        if self.save_last and not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))


class CheckpointMismatchError(ValueError):
    """The checkpoint's weights do not fit the configured model."""


def _last_in(folder: Path) -> list[Path]:
    return [p for pattern in _LAST for p in folder.glob(pattern) if p.is_file()]


def resolve_ckpt_path(ckpt_path: str | os.PathLike | None, *, search_root: Path,
                      own_dir: Path | None = None) -> Path | None:
    """The checkpoint file ``ckpt_path`` names.

    Args:
        ckpt_path: ``None`` (start fresh); ``"last"``; ``"auto"`` (this run's own last checkpoint
            if there is one, else start fresh: for jobs a scheduler may requeue); a ``.ckpt`` file;
            or a run folder (its ``checkpoints/last.ckpt``).
        search_root: where ``"last"`` looks for runs (``<log_dir>/<task>``: single runs and sweeps).
        own_dir: this run's output folder; its own last checkpoint wins for ``"last"``.

    Raises:
        FileNotFoundError: nothing to resume, with where it looked.
    """
    if ckpt_path is None or str(ckpt_path) in ("", "null", "None"):
        return None
    if str(ckpt_path) == "auto":  # preemptible jobs: resume this run's own folder if it has begun
        own = _last_in(own_dir / "checkpoints") if own_dir is not None else []
        return max(own, key=lambda p: p.stat().st_mtime) if own else None
    if str(ckpt_path) == "last":
        if own_dir is not None and (own := _last_in(own_dir / "checkpoints")):
            return max(own, key=lambda p: p.stat().st_mtime)
        candidates = [p for pattern in _LAST for p in search_root.rglob(f"checkpoints/{pattern}") if p.is_file()]
        if not candidates:
            raise FileNotFoundError(
                f"ckpt_path=last: no checkpoints/last.ckpt under {search_root}. Train first (checkpoints are written "
                "to <run>/checkpoints/), point paths.log_dir at the logs of the run to resume, or pass "
                "ckpt_path=<file.ckpt>")
        return max(candidates, key=lambda p: p.stat().st_mtime)
    path = Path(ckpt_path).expanduser()
    if path.is_dir():
        found = _last_in(path / "checkpoints") or _last_in(path)
        if not found:
            raise FileNotFoundError(f"ckpt_path={path} is a folder without checkpoints/last.ckpt; pass the .ckpt file")
        return max(found, key=lambda p: p.stat().st_mtime)
    if not path.is_file():
        raise FileNotFoundError(f"ckpt_path={path}: no such checkpoint file "
                                "(use ckpt_path=last to resume the newest run)")
    return path


def run_dir_of(checkpoint: Path) -> Path | None:
    """The run folder of ``<run>/checkpoints/<file>.ckpt``, or ``None`` for a checkpoint elsewhere."""
    return checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else None


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, Mapping):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: tree}


def _describe(model_cfg: Mapping[str, Any] | None) -> str:
    if not model_cfg:
        return "(not recorded)"
    backbone = model_cfg.get("backbone", {}) or {}
    head = model_cfg.get("head", {}) or {}
    head_args = {k: v for k, v in head.items() if not str(k).startswith("_")}
    return (f"backbone={backbone.get('model_name', backbone.get('_target_'))} "
            f"(out_indices={backbone.get('out_indices')}), head={str(head.get('_target_', '?')).rsplit('.', 1)[-1]} "
            f"{head_args}")


def check_checkpoint_matches(path: Path, module: torch.nn.Module, model_cfg: Mapping[str, Any] | None = None,
                             *, config_key: str = "aggzoo_model_config") -> dict[str, Any]:
    """Raise :class:`CheckpointMismatchError` unless ``path``'s ``state_dict`` has exactly the
    keys and shapes of ``module.state_dict()``. Returns the checkpoint's recorded model config.

    Args:
        path: a Lightning checkpoint written by ``train.py``.
        module: the configured LightningModule.
        model_cfg: the configured ``{"backbone": ..., "head": ...}``, quoted in the error.
    """
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # corrupt, truncated, or pickled code
        raise CheckpointMismatchError(f"cannot read checkpoint {path}: {err}") from err
    if not isinstance(checkpoint, Mapping) or "state_dict" not in checkpoint:
        raise CheckpointMismatchError(f"{path} is not a training checkpoint written by train.py (no 'state_dict'); "
                                      "resume needs <run>/checkpoints/last.ckpt")
    found = {k: tuple(v.shape) for k, v in checkpoint["state_dict"].items()}
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    missing = sorted(expected.keys() - found.keys())
    unexpected = sorted(found.keys() - expected.keys())
    reshaped = sorted(k for k in expected.keys() & found.keys() if expected[k] != found[k])
    recorded = checkpoint.get(config_key) or {}
    if missing or unexpected or reshaped:
        lines = [f"checkpoint {path} does not match the configured model:",
                 f"  checkpoint was trained with: {_describe(recorded)}",
                 f"  this run configures:         {_describe(model_cfg)}"]
        if recorded and model_cfg:
            a, b = _flatten(recorded), _flatten(model_cfg)
            differing = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
            if differing:
                lines.append("  differing config keys: " + ", ".join(
                    f"{k} ({a.get(k)!r} in the checkpoint, {b.get(k)!r} now)" for k in differing[:8]))
        for label, keys in (("missing from the checkpoint", missing), ("not in the model", unexpected)):
            if keys:
                lines.append(f"  {len(keys)} weights {label}, e.g. {', '.join(keys[:4])}")
        if reshaped:
            lines.append("  shape mismatches: " + ", ".join(
                f"{k} {list(found[k])} in the checkpoint vs {list(expected[k])}" for k in reshaped[:4]))
        lines.append("Fix: resume with the backbone/head (and their hyperparameters) the checkpoint was trained with "
                     "(e.g. the overrides in <run>/.hydra/overrides.yaml), or start a new run without ckpt_path.")
        raise CheckpointMismatchError("\n".join(lines))
    return dict(recorded)
