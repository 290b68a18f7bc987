"""Wall-clock time per training step, for run summaries, sweeps and the throughput benchmark."""

from __future__ import annotations

import statistics
import time
from typing import Any

import lightning.pytorch as L

__all__ = ["StepTimer"]


class StepTimer(L.Callback):
    """Records, for every training batch, the time from one batch start to the next (data
    loading + forward/backward/optimiser + logging: what a step costs) and the time from batch
    start to batch end (the step without waiting for data).

    Intervals that span a validation or an epoch boundary are not counted; the first
    ``warmup_steps`` steps of the run are dropped (allocator and cache warm-up).
    """

    def __init__(self, warmup_steps: int = 2) -> None:
        self.warmup_steps = warmup_steps
        self.cycle_seconds: list[float] = []
        self.step_seconds: list[float] = []
        self._last_start: float | None = None
        self._start: float | None = None
        self._seen = 0

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_start = None

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_start = None

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        now = time.perf_counter()
        if self._last_start is not None and self._seen > self.warmup_steps:
            self.cycle_seconds.append(now - self._last_start)
        self._last_start = self._start = now

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self._seen += 1
        if self._start is not None and self._seen > self.warmup_steps:
            self.step_seconds.append(time.perf_counter() - self._start)

    def summary(self) -> dict[str, float | int | None]:
        """Medians in seconds (``None`` before enough steps ran)."""
        def median(values: list[float]) -> float | None:
            return statistics.median(values) if values else None

        return {"seconds_per_step": median(self.cycle_seconds) or median(self.step_seconds),
                "compute_seconds_per_step": median(self.step_seconds), "timed_steps": len(self.step_seconds)}
