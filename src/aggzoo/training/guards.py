"""Detect non-finite losses and gradients during training, and either skip the step or stop.

One NaN step poisons every weight through the optimiser state; it usually comes from a too high
learning rate, an fp16 overflow, or an odd batch (an image that is all one colour, a degenerate
mining result). :class:`NonFiniteGuard` checks the loss before the backward pass and every
gradient before the optimiser step:

- ``policy="skip"``: the step's gradients are dropped (``zero_grad(set_to_none=True)``, so the
  optimiser leaves every parameter and its state alone), the step is counted (logged as
  ``train/nonfinite_steps``) and training goes on; ``max_consecutive`` skipped steps in a row stop
  the run, which has then diverged.
- ``policy="stop"``: :class:`NonFiniteError` stops the run, naming the global step, the epoch, the
  batch index and the image files of the batch (the first few in the message, all of them in a
  ``nonfinite_step<N>.txt`` file in the run folder).

The files come from the labels: a training batch carries place ids, and a dataset that exposes
``place_ids`` (sorted) and ``item(index)`` or ``image_paths(index)`` (as
:class:`~aggzoo.data.gsv_cities.GSVCitiesDataset` does) gives back the images of each place for the
current epoch, so batches need not carry their paths.

Under ``16-mixed`` precision the gradient check is left to the GradScaler (which skips overflowing
steps by design); the loss is still checked.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import lightning.pytorch as L
import numpy as np
import torch
from torch import Tensor

from aggzoo.errors import NonFiniteError

__all__ = ["NonFiniteGuard", "batch_image_files"]

log = logging.getLogger(__name__)

POLICIES = ("skip", "stop")




def batch_image_files(trainer: L.Trainer, labels: Tensor | None) -> list[str] | None:
    """The image files of a training batch, recovered from its place-id labels (or ``None``)."""
    dataset = getattr(trainer.datamodule, "train_dataset", None) if trainer.datamodule is not None else None
    place_ids = getattr(dataset, "place_ids", None)
    if dataset is None or place_ids is None or labels is None:
        return None
    place_ids = np.asarray(place_ids)
    if hasattr(dataset, "set_epoch"):
        dataset.set_epoch(trainer.current_epoch)
    files: list[str] = []
    for label in dict.fromkeys(int(v) for v in labels.flatten().tolist()):  # unique, in batch order
        index = int(np.searchsorted(place_ids, label))
        if index >= len(place_ids) or int(place_ids[index]) != label:
            return None
        try:
            paths = dataset.item(index)[2] if hasattr(dataset, "item") else dataset.image_paths(index)
        except Exception:  # noqa: BLE001 - a report of the files must not hide the original problem
            return None
        files += [str(p) for p in paths]
    return files


class NonFiniteGuard(L.Callback):
    """Check every training step for a non-finite loss or gradient (see the module docstring).

    Args:
        policy: ``"skip"`` (drop the step and count it) or ``"stop"`` (raise :class:`NonFiniteError`).
        max_consecutive: under ``skip``, this many skipped steps in a row stop the run.
        check_gradients: also check gradients (off: the loss only).
        shown_files: file names quoted in the error message (all are written to the list file).
    """

    def __init__(self, *, policy: str = "skip", max_consecutive: int = 20, check_gradients: bool = True,
                 shown_files: int = 8) -> None:
        if policy not in POLICIES:
            raise ValueError(f"NonFiniteGuard policy must be one of {POLICIES}, got {policy!r}")
        self.policy = policy
        self.max_consecutive = int(max_consecutive)
        self.check_gradients = check_gradients
        self.shown_files = shown_files
        self.skipped: list[dict[str, Any]] = []
        self._consecutive = 0
        self._loss: float | None = None
        self._labels: Tensor | None = None
        self._batch_idx = -1

    # -- state -------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"skipped": list(self.skipped)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.skipped = list(state_dict.get("skipped", []))

    # -- hooks -------------------------------------------------------------------------------------
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._batch_idx = batch_idx
        self._loss = None
        labels = batch[1] if isinstance(batch, (tuple, list)) and len(batch) > 1 else None
        self._labels = labels.detach().cpu() if isinstance(labels, Tensor) else None

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: Tensor) -> None:
        if not bool(torch.isfinite(loss.detach()).all()):
            self._loss = float(loss.detach().float().flatten()[0])

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule,
                                 optimizer: torch.optim.Optimizer) -> None:
        bad_params: list[str] = []
        scaler_handles_grads = str(trainer.precision) in ("16-mixed", "16", "16-true")
        if self.check_gradients and not scaler_handles_grads:
            named = [(n, p.grad.detach()) for n, p in pl_module.named_parameters() if p.grad is not None]
            # One fused max-abs over all gradients and one device sync (NaN and inf survive the max);
            # the per-parameter pass that names the culprits runs only when something is wrong.
            if named and not bool(torch.isfinite(torch.nn.utils.get_total_norm([g for _, g in named], math.inf))):
                bad_params = [n for n, g in named if not bool(torch.isfinite(g).all())]
        if self._loss is None and not bad_params:
            self._consecutive = 0
            return
        # A non-finite loss makes every gradient non-finite too: name the cause only.
        what = [f"non-finite loss ({self._loss})" if self._loss is not None else
                f"non-finite gradients in {len(bad_params)} parameters (e.g. {', '.join(bad_params[:3])})"]
        where = f"global step {trainer.global_step} (epoch {trainer.current_epoch}, batch {self._batch_idx})"
        if self.policy == "stop":
            raise NonFiniteError(self._stop_message(trainer, " and ".join(what), where))
        optimizer.zero_grad(set_to_none=True)
        self._consecutive += 1
        self.skipped.append({"step": trainer.global_step, "epoch": trainer.current_epoch, "batch": self._batch_idx,
                             "loss_finite": self._loss is None, "bad_parameters": len(bad_params)})
        pl_module.log("train/nonfinite_steps", float(len(self.skipped)), on_step=True, on_epoch=False)
        log.warning("skipped the update of %s: %s (%d skipped so far)", where, " and ".join(what), len(self.skipped))
        if self._consecutive >= self.max_consecutive:
            raise NonFiniteError(
                f"{self._consecutive} consecutive training steps had a non-finite loss or gradients (last: {where}): "
                "training has diverged. Lower the learning rate (optimizer.lr), clip gradients "
                "(trainer.gradient_clip_val=1.0), or use bf16/fp32 instead of fp16; resume from the last good "
                "checkpoint.")

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.skipped:
            steps = [s["step"] for s in self.skipped]
            log.warning("%d training steps were skipped for a non-finite loss or gradients: steps %s%s",
                        len(steps), steps[:20], " ..." if len(steps) > 20 else "")

    # -- reporting ---------------------------------------------------------------------------------
    def _stop_message(self, trainer: L.Trainer, what: str, where: str) -> str:
        files = batch_image_files(trainer, self._labels)
        lines = [f"{what} at {where}."]
        if files:
            listing = Path(trainer.default_root_dir or ".") / f"nonfinite_step{trainer.global_step}.txt"
            try:
                listing.parent.mkdir(parents=True, exist_ok=True)
                listing.write_text("".join(f"{f}\n" for f in files))
                saved = f" (all {len(files)} listed in {listing})"
            except OSError:
                saved = ""
            shown = ", ".join(files[: self.shown_files]) + (", ..." if len(files) > self.shown_files else "")
            lines.append(f"The batch's images{saved}: {shown}.")
        else:
            lines.append("The batch's image files are unknown (the training dataset exposes no place_ids/image_paths).")
        lines.append("Fix: lower the learning rate (optimizer.lr), clip gradients (trainer.gradient_clip_val=1.0), "
                     "check these images, or skip such steps with callbacks.non_finite.policy=skip.")
        return " ".join(lines)
