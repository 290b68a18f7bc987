"""Ctrl-C stops training cleanly: finish the step, save a resumable checkpoint, stop, exit 130.

What Lightning 2.6 does by itself on Ctrl-C: the ``KeyboardInterrupt`` lands wherever Python
happens to be (possibly in the middle of ``optimizer.step``, with half of the weights updated),
Lightning runs the ``on_exception`` hooks, tears down and calls ``sys.exit(1)``. Nothing is saved
unless ``ModelCheckpoint(save_on_exception=True)`` or ``OnExceptionCheckpoint`` is configured, and
those save that possibly half-updated state (``OnExceptionCheckpoint`` even deletes its file again
in ``teardown`` after a normal end). DataLoader worker processes, which receive the terminal's
SIGINT too, exit, so the loader fails on its next batch.

:class:`GracefulInterrupt` replaces that with a flag: the first Ctrl-C (SIGINT) is noted; at the end
of the current training step the full training state is saved (where ``ModelCheckpoint`` saves
every n steps), Lightning finishes that step's bookkeeping (scheduler step, logged metrics) and
:class:`StoppedByCtrlC` is raised as the next step begins (a ``SystemExit`` with status 130 = 128 +
SIGINT). ``trainer.should_stop`` is not used for this: Lightning would then validate the *partial*
epoch, ``ModelCheckpoint`` would save it as a top-k checkpoint (deleting the best one of the completed
epochs) and write it as ``last.ckpt`` marked as a finished epoch, so a resume would skip the rest of
that epoch.
When the signal comes in the epoch's last step or during its validation, the epoch is complete: it
is validated and checkpointed as usual, then the state is saved at the epoch's end and the trainer
stops. The pipeline then skips the test evaluation, prints how to resume and exits with 130.

The state goes to the ``last.ckpt`` of the ``ModelCheckpoint`` when it keeps one (recorded as that
callback's own last file, so the resumed run refreshes it instead of writing ``last-v1.ckpt``;
``ckpt_path=last`` resumes from it, mid-epoch), else to ``<default_root_dir>/interrupted.ckpt``. A
second Ctrl-C aborts at once (Lightning's behaviour). Loader workers ignore SIGINT so they stay
alive for the last step.

SIGTERM (``kill``, ``docker stop``, a scheduler's time limit) gets the same treatment. Lightning's own
SIGTERM handler notes the signal and raises ``SIGTERMException`` (a ``SystemExit`` with status 0) at the
end of the current batch or validation step, saving nothing; this callback saves the same checkpoint
first (at the end of the training step, without ``should_stop``, so that the partial epoch is not
validated before Lightning raises, or from ``on_exception`` when the signal came during validation or
was broadcast to the other DDP ranks), and the pipeline exits with status 143 (128 + SIGTERM) after printing how to
resume.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any

import lightning.pytorch as L
from lightning.pytorch.utilities.exceptions import SIGTERMException

__all__ = ["GracefulInterrupt", "StoppedByCtrlC", "ignore_sigint_in_worker"]

log = logging.getLogger(__name__)


class StoppedByCtrlC(SystemExit):
    """Raised by :class:`GracefulInterrupt` after saving the state of a step interrupted by Ctrl-C;
    exit status 130 (128 + SIGINT), as a shell reports a process stopped by Ctrl-C."""

    def __init__(self) -> None:
        super().__init__(128 + signal.SIGINT)


def ignore_sigint_in_worker(worker_id: int) -> None:
    """``worker_init_fn`` that leaves Ctrl-C to the main process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class _ChainedInit:
    """``worker_init_fn`` running :func:`ignore_sigint_in_worker` then the loader's own (picklable)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __call__(self, worker_id: int) -> None:
        ignore_sigint_in_worker(worker_id)
        if self.inner is not None:
            self.inner(worker_id)


def _loaders(obj: Any) -> list[Any]:
    if obj is None:
        return []
    if isinstance(obj, (list, tuple)):
        return [d for item in obj for d in _loaders(item)]
    if isinstance(obj, dict):
        return [d for item in obj.values() for d in _loaders(item)]
    flattened = getattr(obj, "flattened", None)  # Lightning's CombinedLoader
    if isinstance(flattened, list):
        return _loaders(flattened)
    return [obj] if hasattr(obj, "worker_init_fn") else []


class GracefulInterrupt(L.Callback):
    """First Ctrl-C: save a checkpoint at the next step boundary and stop (see module docstring).

    Args:
        filename: file name in the ``ModelCheckpoint`` folder; default ``last.ckpt`` when that
            callback keeps one, else ``interrupted.ckpt`` in the trainer's ``default_root_dir``.
    """

    def __init__(self, *, filename: str | None = None) -> None:
        self.filename = filename
        self.requested = False
        self.saved_path: Path | None = None
        self._previous: Any = None
        self._installed = False
        self._main_pid = os.getpid()

    # -- signal handling ---------------------------------------------------------------------------
    def _handler(self, signum: int, frame: Any) -> None:
        if os.getpid() != self._main_pid:  # a forked worker inherited this handler: not its business
            return
        if self.requested:
            self._restore()
            raise KeyboardInterrupt
        self.requested = True
        log.warning("Ctrl-C: finishing this training step, then saving a checkpoint and stopping "
                    "(press Ctrl-C again to abort at once, without saving)")

    def _install(self) -> None:
        if self._installed or threading.current_thread() is not threading.main_thread():
            return
        self._main_pid = os.getpid()
        self._previous = signal.getsignal(signal.SIGINT)
        signal.signal(signal.SIGINT, self._handler)
        self._installed = True

    def _restore(self) -> None:
        if self._installed and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self._previous if self._previous is not None else signal.default_int_handler)
        self._installed = False

    # -- hooks -------------------------------------------------------------------------------------
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.requested = False
        self.saved_path = None
        self._install()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._protect_workers(trainer)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._protect_workers(trainer)

    def _protect_workers(self, trainer: L.Trainer) -> None:
        for loader in _loaders(trainer.train_dataloader) + _loaders(getattr(trainer, "val_dataloaders", None)):
            if getattr(loader, "num_workers", 0) > 0 and not isinstance(loader.worker_init_fn, _ChainedInit):
                loader.worker_init_fn = _ChainedInit(loader.worker_init_fn)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        # Under DDP every rank must save (a collective) and stop together: any rank's Ctrl-C counts.
        if trainer.world_size > 1:
            self.requested = bool(trainer.strategy.reduce_boolean_decision(self.requested, all=False))
        if not (self.requested or trainer.received_sigterm):
            return
        if trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
            # The epoch is complete: let it be validated and checkpointed, save at its end (below).
            self.requested = True
            return
        # Mid-epoch: save now, stop as the next step begins (SIGTERM: Lightning raises at this step's end).
        # Not should_stop: Lightning would validate this partial epoch first (module docstring).
        self._save(trainer)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self.saved_path is not None and self.requested:
            raise StoppedByCtrlC()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.requested:
            self._save_and_stop(trainer)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        previous = self._previous
        self._restore()
        # Lightning's signal connector, torn down right after this hook, restores the handlers it found
        # when fit began, this one among them: make it restore the handler that was there before.
        originals = getattr(getattr(trainer, "_signal_connector", None), "_original_handlers", None)
        if isinstance(originals, dict) and getattr(originals.get(signal.SIGINT), "__self__", None) is self:
            originals[signal.SIGINT] = previous if previous is not None else signal.default_int_handler
        if isinstance(exception, SIGTERMException) and trainer.state.fn == "fit":
            # Raised between two steps (or two validation batches): the state is whole, so save it.
            self._save_and_stop(trainer)

    def _save_and_stop(self, trainer: L.Trainer) -> None:
        self._save(trainer)
        trainer.should_stop = True

    def _save(self, trainer: L.Trainer) -> None:
        if self.saved_path is None:
            path = self._target(trainer)
            if self._is_callbacks_last(trainer):
                # ModelCheckpoint's own last file: recorded as such in the saved state, else the resumed
                # run would find a last.ckpt it did not write and save its next one as last-v1.ckpt.
                trainer.checkpoint_callback.last_model_path = str(path)
            trainer.save_checkpoint(path)
            self.saved_path = path
            log.warning("interrupted: saved %s at global step %d (epoch %d); resume with ckpt_path=%s",
                        path, trainer.global_step, trainer.current_epoch, path)

    def _is_callbacks_last(self, trainer: L.Trainer) -> bool:
        callback = trainer.checkpoint_callback
        return self.filename is None and bool(getattr(callback, "dirpath", None)) and \
            bool(getattr(callback, "save_last", False))

    def _target(self, trainer: L.Trainer) -> Path:
        callback = trainer.checkpoint_callback
        folder = getattr(callback, "dirpath", None)
        if self.filename is not None:
            return Path(folder or trainer.default_root_dir) / self.filename
        if self._is_callbacks_last(trainer):
            return Path(folder) / f"{callback.CHECKPOINT_NAME_LAST}{callback.FILE_EXTENSION}"
        return Path(trainer.default_root_dir) / "interrupted.ckpt"
