"""The LightningModule: metric learning on P x K batches, Recall@k validation."""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import lightning.pytorch as L
import numpy as np
import torch
from torch import Tensor

from aggzoo.models.vpr_model import VPRModel
from aggzoo.training.losses import MetricLoss

__all__ = ["VPRLightningModule", "parameter_groups"]


def parameter_groups(model: torch.nn.Module, *, base_lr: float, lr_multipliers: Mapping[str, float],
                     no_weight_decay: Sequence[str]) -> list[dict[str, Any]]:
    """Split trainable parameters into optimizer groups.

    ``lr_multipliers`` maps glob patterns over parameter names (``head.pool.p``) to a factor of
    the base LR (the first matching pattern wins); parameters matching ``no_weight_decay``
    get ``weight_decay=0`` (GeM's ``p``, as upstream).
    """
    groups: dict[tuple[float, bool], list[torch.nn.Parameter]] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        mult = next((m for pattern, m in lr_multipliers.items() if fnmatch.fnmatch(name, pattern)), 1.0)
        decay = not any(fnmatch.fnmatch(name, pattern) for pattern in no_weight_decay)
        groups.setdefault((float(mult), decay), []).append(param)
    out = []
    for (mult, decay), params in groups.items():
        group: dict[str, Any] = {"params": params, "lr": base_lr * mult}
        if not decay:
            group["weight_decay"] = 0.0
        out.append(group)
    return out


class VPRLightningModule(L.LightningModule):
    """Trains a :class:`VPRModel` with a metric loss and validates Recall@k on retrieval sets.

    Args:
        model: backbone + head.
        loss: the metric loss (with its miner).
        optimizer: ``partial`` of a torch optimizer without ``params`` (``conf/optimizer``).
        scheduler: ``partial`` of a factory in :mod:`aggzoo.training.schedulers` or ``None``.
        lr_multipliers, no_weight_decay: see :func:`parameter_groups`.
        val_set_sizes: name -> (num_database, positives) of each validation set, in the order of
            the data module's validation loaders.
        recall_ks: the k of the logged Recall@k.
    """

    def __init__(self, model: VPRModel, *, loss: MetricLoss, optimizer: Callable[..., torch.optim.Optimizer],
                 scheduler: Callable[..., Any] | None = None, lr_multipliers: Mapping[str, float] | None = None,
                 no_weight_decay: Sequence[str] = (), val_sets: Mapping[str, tuple[int, Sequence[np.ndarray]]] | None = None,
                 recall_ks: Sequence[int] = (1, 5, 10)) -> None:
        super().__init__()
        self.model = model
        self.loss = loss
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.lr_multipliers = dict(lr_multipliers or {})
        self.no_weight_decay = list(no_weight_decay)
        self.val_sets = dict(val_sets or {})
        self.recall_ks = tuple(recall_ks)
        self._val_descriptors: list[Tensor | None] = []

    def forward(self, images: Tensor) -> Tensor:
        return self.model(images)

    # -- training -------------------------------------------------------------------------------
    def on_train_epoch_start(self) -> None:
        dataset = self.trainer.datamodule.train_dataset if self.trainer.datamodule is not None else None
        if hasattr(dataset, "set_epoch"):
            dataset.set_epoch(self.current_epoch)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        images, labels = batch  # [P, K, 3, H, W], [P, K]
        descriptors = self.model(images.flatten(0, 1))
        loss = self.loss(descriptors, labels.flatten())
        self.log("train/loss", loss, prog_bar=True, batch_size=labels.numel())
        self.log("train/mined_fraction", self.loss.last_mined_fraction, batch_size=labels.numel())
        return loss

    def configure_optimizers(self) -> Any:
        base_lr = getattr(self.optimizer_factory, "keywords", {}).get("lr")
        if base_lr is None:
            raise ValueError("the optimizer config must set lr")
        optimizer = self.optimizer_factory(parameter_groups(
            self.model, base_lr=base_lr, lr_multipliers=self.lr_multipliers, no_weight_decay=self.no_weight_decay))
        if self.scheduler_factory is None:
            return optimizer
        total_steps = int(self.trainer.estimated_stepping_batches)
        epochs = max(1, self.trainer.max_epochs or 1)
        scheduler = self.scheduler_factory(optimizer, total_steps=total_steps,
                                           steps_per_epoch=max(1, math.ceil(total_steps / epochs)))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # -- validation -----------------------------------------------------------------------------
    def on_validation_epoch_start(self) -> None:
        self._val_descriptors = [None] * len(self.val_sets)

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        images, indices = batch
        descriptors = self.model(images).float()
        buffer = self._val_descriptors[dataloader_idx]
        if buffer is None:
            num_db, positives = list(self.val_sets.values())[dataloader_idx]
            buffer = torch.zeros(num_db + len(positives), descriptors.shape[1], device=descriptors.device)
            self._val_descriptors[dataloader_idx] = buffer
        buffer[indices] = descriptors

    def on_validation_epoch_end(self) -> None:
        from aggzoo.evaluation.retrieval import recall_at_k, search

        for index, (name, (num_db, positives)) in enumerate(self.val_sets.items()):
            buffer = self._val_descriptors[index]
            if buffer is None:  # sanity check with limited batches
                continue
            descriptors = buffer.cpu().numpy()
            k = min(max(self.recall_ks), num_db)
            predictions = search(descriptors[:num_db], descriptors[num_db:], k)
            recalls = recall_at_k(predictions, positives, ks=[k_ for k_ in self.recall_ks if k_ <= num_db])
            for k_, value in recalls.items():
                self.log(f"val/{name}/R@{k_}", value, prog_bar=(k_ == 1), add_dataloader_idx=False)
            if index == 0:
                # The metric checkpoints and early stopping monitor, whatever the set is called.
                self.log("val/R@1", recalls[1], add_dataloader_idx=False)
        self._val_descriptors = []
