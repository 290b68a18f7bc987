"""Never lose a run: checkpoint files written atomically, ``last.ckpt`` always fresh, resume checked.

Writing. :func:`atomic_save` streams ``torch.save`` into a temporary file *in the target's folder*,
flushes and ``fsync``\\ s it, then ``os.replace``\\ s it over the target and ``fsync``\\ s the folder. A
process killed at any point (or a power cut, thanks to the fsyncs) leaves the previous file
untouched; the orphaned ``.<name>.partial-<pid>-<tag>`` is removed by the next save once its writer
is dead. Compared with Lightning's default writer (serialise to an in-memory buffer, write it
through an fsspec transaction staged in the system temporary folder, move it into place): no second
copy of the checkpoint in RAM, nothing staged on ``/tmp`` (often a small tmpfs: a multi-GB
checkpoint fails there while the output disk has room), and a disk-full error is reported as a
:class:`~aggzoo.errors.DiskFullError` that names the file, the free space, the size needed and the
fix. :class:`DurableCheckpointIO` is the Lightning plugin (``conf/trainer/default.yaml``) that makes
every checkpoint Lightning writes go through it.

Keeping ``last.ckpt`` current. :class:`RunCheckpoint` is Lightning's ``ModelCheckpoint`` with
``last.ckpt`` refreshed at every save point.

Resuming. :func:`resolve_ckpt_path` turns ``ckpt_path=last`` (or a run folder) into a file: the
run's own ``checkpoints/last.ckpt`` when it has one (a requeued SLURM job), else the newest
``last.ckpt`` under the log folder. :func:`check_checkpoint_matches` reads the checkpoint with the
one safe reader (:func:`aggzoo.hub.checkpoint.read_checkpoint`: no code runs, a recorded spec naming
anything but aggzoo's model classes is refused) and compares its weights with the configured model
before Lightning touches the file, raising one :class:`~aggzoo.errors.CheckpointMismatchError`
that names the differing keys, both model configs and the fix.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import secrets
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO

from aggzoo.errors import CheckpointMismatchError, CheckpointNotFoundError, DiskFullError
from aggzoo.hub.checkpoint import CheckpointFile, read_checkpoint

__all__ = ["DurableCheckpointIO", "RunCheckpoint", "atomic_save", "check_checkpoint_matches", "resolve_ckpt_path",
           "run_dir_of", "tensor_bytes"]

log = logging.getLogger(__name__)


# -- writing checkpoint files ----------------------------------------------------------------------

log = logging.getLogger(__name__)

_DISK_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
_LAST = ("last.ckpt", "last-v*.ckpt")


def tensor_bytes(obj: Any) -> int:
    """Bytes of the tensors in a nested checkpoint (a lower bound of its file size)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def _human(num_bytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(num_bytes) < 1024 or unit == "TB":
            return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.1f} {unit}"
        num_bytes /= 1024
    return f"{num_bytes:.1f} TB"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale_partials(target: Path) -> None:
    pattern = re.compile(rf"^\.{re.escape(target.name)}\.partial-(\d+)-[0-9a-f]+$")
    for candidate in target.parent.glob(f".{target.name}.partial-*"):
        match = pattern.match(candidate.name)
        if match and not _alive(int(match.group(1))):
            candidate.unlink(missing_ok=True)
            log.info("removed %s left by an interrupted save", candidate)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # e.g. file systems that do not open folders
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _disk_full(target: Path, obj: Any, err: OSError) -> DiskFullError:
    try:
        free = _human(shutil.disk_usage(target.parent).free)
    except OSError:
        free = "unknown"
    previous = (f"The previous {target.name} is intact. " if target.exists() else "")
    return DiskFullError(
        errno.ENOSPC,
        f"disk full while writing {target} ({os.strerror(err.errno or errno.ENOSPC)}; {free} free on that file "
        f"system, the file needs at least {_human(tensor_bytes(obj))}). {previous}Free some space or write to a "
        "larger disk (paths.output_dir=..., or callbacks.model_checkpoint.dirpath=...), then resume with "
        "ckpt_path=<the last checkpoint>.",
    )


class _WriteErrors:
    """A binary file's ``write`` / ``flush`` that keep the first ``OSError`` they raise (``error``)."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return self.handle.write(data)
        except OSError as err:
            self.error = self.error or err
            raise

    def flush(self) -> None:
        try:
            self.handle.flush()
        except OSError as err:
            self.error = self.error or err
            raise


def atomic_save(obj: Any, path: str | os.PathLike, *, save: Callable[[Any, Any], None] = torch.save) -> None:
    """``save(obj, file)`` to ``path`` atomically and durably (see the module docstring).

    Raises:
        DiskFullError: no space (or quota) left; the partial file is removed, ``path`` is untouched.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_partials(target)
    tmp = target.with_name(f".{target.name}.partial-{os.getpid()}-{secrets.token_hex(4)}")
    writer: _WriteErrors | None = None
    try:
        # os.open with 0o666 lets the umask decide the mode, as for any other file the run writes.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as handle:
            writer = _WriteErrors(handle)
            save(obj, writer)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        # torch.save's zip writer swallows the OSError of a failed write and raises its own RuntimeError
        # ("enforce fail at inline_container.cc ... unexpected pos"): the writer kept the OSError.
        cause = err if isinstance(err, OSError) else writer.error if writer is not None else None
        if isinstance(cause, OSError) and cause.errno in _DISK_FULL:
            raise _disk_full(target, obj, cause) from err
        raise
    _fsync_dir(target.parent)


class DurableCheckpointIO(TorchCheckpointIO):
    """Lightning checkpoint writer using :func:`atomic_save` for local paths (``trainer.plugins``).

    Remote URLs (``s3://``...) are written by Lightning's own writer.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike,
                        storage_options: Any | None = None) -> None:
        if "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options=storage_options)
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} does not take storage_options (got {storage_options!r})")
        atomic_save(checkpoint, path)
        return None


# -- keeping last.ckpt current and resuming --------------------------------------------------------



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
        CheckpointNotFoundError: nothing to resume, with where it looked.
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
            raise CheckpointNotFoundError(
                f"ckpt_path=last: no checkpoints/last.ckpt under {search_root}. Train first (checkpoints are written "
                "to <run>/checkpoints/), point paths.log_dir at the logs of the run to resume, or pass "
                "ckpt_path=<file.ckpt>")
        return max(candidates, key=lambda p: p.stat().st_mtime)
    path = Path(ckpt_path).expanduser()
    if path.is_dir():
        found = _last_in(path / "checkpoints") or _last_in(path)
        if not found:
            raise CheckpointNotFoundError(f"ckpt_path={path} is a folder without checkpoints/last.ckpt; pass the .ckpt file")
        return max(found, key=lambda p: p.stat().st_mtime)
    if not path.is_file():
        raise CheckpointNotFoundError(f"ckpt_path={path}: no such checkpoint file "
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


def check_checkpoint_matches(path: Path | CheckpointFile, module: torch.nn.Module,
                             model_cfg: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Raise :class:`CheckpointMismatchError` unless ``path``'s ``state_dict`` has exactly the
    keys and shapes of ``module.state_dict()``. Returns the checkpoint's recorded model config.

    Args:
        path: a Lightning checkpoint written by ``train.py``, or what :func:`read_checkpoint` read from one.
        module: the configured LightningModule.
        model_cfg: the configured ``{"backbone": ..., "head": ...}``, quoted in the error.
    """
    # No code runs; a recorded spec naming other code is refused by the reader.
    stored = path if isinstance(path, CheckpointFile) else read_checkpoint(path)
    path = stored.path
    checkpoint = stored.contents
    if not isinstance(checkpoint, Mapping) or "state_dict" not in checkpoint:
        raise CheckpointMismatchError(f"{path} is not a training checkpoint written by train.py (no 'state_dict'); "
                                      "resume needs <run>/checkpoints/last.ckpt")
    found = {k: tuple(v.shape) for k, v in checkpoint["state_dict"].items()}
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    missing = sorted(expected.keys() - found.keys())
    unexpected = sorted(found.keys() - expected.keys())
    reshaped = sorted(k for k in expected.keys() & found.keys() if expected[k] != found[k])
    recorded = stored.spec or {}
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
