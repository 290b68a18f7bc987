"""Fault injection for testing that runs survive interruptions (``+callbacks.crash=...``)."""

from __future__ import annotations

import os
import signal
from typing import Any

import lightning.pytorch as L

__all__ = ["KillAtStep"]


class KillAtStep(L.Callback):
    """SIGKILLs its own process (no clean-up, no final checkpoint: a pulled plug or an OOM kill)
    when the training batch that completes global step ``step`` ends, before the checkpoint
    callbacks of that batch run (Lightning runs checkpointing callbacks last).

    ``python train.py +callbacks.crash._target_=aggzoo.training.faults.KillAtStep +callbacks.crash.step=5``
    """

    def __init__(self, step: int) -> None:
        self.step = int(step)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if trainer.global_step >= self.step:
            os.kill(os.getpid(), signal.SIGKILL)
