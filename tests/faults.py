"""Fault injection for testing that runs survive interruptions (``+callbacks.crash=...``)."""

from __future__ import annotations

import os
import signal as _signal
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as L

__all__ = ["KillAtStep", "PauseAtStep"]


class KillAtStep(L.Callback):
    """Sends a signal to its own process, once, when the training batch that completes global step
    ``step`` ends, before the checkpoint callbacks of that batch run (Lightning runs checkpointing
    callbacks last). ``SIGKILL`` (default): no clean-up, no final checkpoint, as a pulled plug or an
    OOM kill; ``SIGTERM``: a polite stop, as ``kill`` or a scheduler's time limit.

    ``python train.py +callbacks.crash._target_=faults.KillAtStep +callbacks.crash.step=5
    [+callbacks.crash.signal=SIGTERM]``
    """

    def __init__(self, step: int, signal: str = "SIGKILL") -> None:
        self.step = int(step)
        self.signal = _signal.Signals[signal]
        self.sent = False

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if trainer.global_step >= self.step and not self.sent:
            self.sent = True
            os.kill(os.getpid(), self.signal)


class PauseAtStep(L.Callback):
    """Holds the training step that completes global step ``step`` (at its start) until a Ctrl-C has
    been noted by ``GracefulInterrupt``, after writing ``marker``: a test then sends a real SIGINT to a
    ``python train.py`` that is known to be in the middle of that step, as a user's Ctrl-C would be.

    ``python train.py +callbacks.pause._target_=faults.PauseAtStep +callbacks.pause.step=6
    +callbacks.pause.marker=<file>``
    """

    def __init__(self, step: int, marker: str, timeout: float = 300.0) -> None:
        self.step, self.marker, self.timeout = int(step), Path(marker), float(timeout)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if trainer.global_step != self.step - 1:
            return
        self.marker.write_text(str(os.getpid()))
        deadline = time.monotonic() + self.timeout
        while not any(getattr(c, "requested", False) for c in trainer.callbacks) and time.monotonic() < deadline:
            time.sleep(0.02)
