"""Fault injection for testing that runs survive interruptions (``+callbacks.crash=...``)."""

from __future__ import annotations

import os
import signal as _signal
from typing import Any

import lightning.pytorch as L

__all__ = ["KillAtStep"]


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
