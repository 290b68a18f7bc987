"""The LightningModule: metric learning on P x K batches, Recall@k validation.

Scale features (all off or neutral on one CPU, see the arguments of :class:`VPRLightningModule`):
per-group learning rates, gradient checkpointing, an fp32 head under mixed precision,
``torch.compile``, a loss over the global batch under DDP, validation descriptors gathered across
ranks, and the RNG streams saved in every checkpoint so a resumed run continues bit for bit.
"""

from __future__ import annotations

import fnmatch
import logging
import math
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import lightning.pytorch as L
import numpy as np
import torch
from torch import Tensor

from aggzoo.models.features import Features
from aggzoo.models.heads.base import Head
from aggzoo.models.vpr_model import VPRModel
from aggzoo.training.losses import MarginLoss, MetricLoss, loss_parameter_groups

__all__ = ["VPRLightningModule", "declared_parameter_options", "parameter_groups", "enable_gradient_checkpointing",
           "rng_state", "set_rng_state"]

log = logging.getLogger(__name__)

#: Checkpoint key holding the per-rank RNG states.
RNG_STATE_KEY = "aggzoo_rng_states"


def declared_parameter_options(model: torch.nn.Module) -> tuple[dict[str, float], set[str]]:
    """What the heads inside ``model`` declare (:meth:`Head.lr_multipliers`, :meth:`Head.no_weight_decay`),
    as globs over ``model``'s parameter names: ``({"head.pool.p": 10.0}, {"head.pool.p"})`` for GeM."""
    multipliers: dict[str, float] = {}
    no_decay: set[str] = set()
    for path, module in model.named_modules():
        if isinstance(module, Head):
            prefix = f"{path}." if path else ""
            multipliers.update({prefix + name: float(m) for name, m in module.lr_multipliers().items()})
            no_decay.update(prefix + name for name in module.no_weight_decay())
    return multipliers, no_decay


def parameter_groups(model: torch.nn.Module, *, base_lr: float, lr_multipliers: Mapping[str, float] | None = None,
                     no_weight_decay: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Split trainable parameters into optimizer groups.

    Each head in ``model`` declares its own parameters that train with a scaled LR or without weight
    decay (GeM's and CosPlace's ``p``: 10x, no weight decay, as upstream; see
    :func:`declared_parameter_options`). ``lr_multipliers`` (glob over parameter names, e.g.
    ``backbone.*`` -> factor of the base LR) and ``no_weight_decay`` (globs) add to these: for the
    LR the first matching pattern wins, the given ones before the declared ones. Frozen parameters
    are left out. Each group carries a ``name`` (``lr_x10``, ``lr_x1_no_wd``) for the LR monitor.
    """
    declared_multipliers, declared_no_decay = declared_parameter_options(model)
    multipliers = {**dict(lr_multipliers or {})}
    multipliers.update({k: v for k, v in declared_multipliers.items() if k not in multipliers})
    no_decay = [*no_weight_decay, *sorted(declared_no_decay)]
    groups: dict[tuple[float, bool], list[torch.nn.Parameter]] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        mult = next((m for pattern, m in multipliers.items() if fnmatch.fnmatch(name, pattern)), 1.0)
        decay = not any(fnmatch.fnmatch(name, pattern) for pattern in no_decay)
        groups.setdefault((float(mult), decay), []).append(param)
    out = []
    for (mult, decay), params in groups.items():
        name = f"lr_x{mult:g}" + ("" if decay else "_no_wd")
        group: dict[str, Any] = {"params": params, "lr": base_lr * mult, "name": name}
        if not decay:
            group["weight_decay"] = 0.0
        out.append(group)
    return out


def enable_gradient_checkpointing(model: VPRModel) -> bool:
    """Recompute the backbone's blocks in the backward pass instead of storing their activations
    (timm's ``set_grad_checkpointing``, honoured by ``forward_intermediates`` of ViTs, ResNets and
    EfficientNets). Frozen blocks store nothing either way. Returns whether the backbone supports it."""
    timm_model = getattr(model.backbone, "model", None)
    setter = getattr(timm_model, "set_grad_checkpointing", None)
    if not callable(setter):
        return False
    setter(True)
    return True


def rng_state() -> dict[str, Any]:
    """The torch (CPU and CUDA), numpy and python RNG states, in types ``torch.load(weights_only=True)`` reads."""
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": (np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), int(np_state[2]), int(np_state[3]),
                  float(np_state[4])),
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Inverse of :func:`rng_state`."""
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _features_to_float(features: Features) -> Features:
    def as_float(tensor: Tensor | None) -> Tensor | None:
        return tensor.float() if tensor is not None else None

    return Features(maps=tuple(m.float() for m in features.maps), cls=as_float(features.cls),
                    tokens=as_float(features.tokens),
                    cls_levels=tuple(c.float() for c in features.cls_levels) if features.cls_levels is not None else None,
                    cls_attention=as_float(features.cls_attention))


class VPRLightningModule(L.LightningModule):
    """Trains a :class:`VPRModel` with a metric loss and validates Recall@k on retrieval sets.

    Args:
        model: backbone + head.
        loss: the metric loss (with its miner), or a :class:`~aggzoo.training.losses.MarginLoss` whose
            class weights train in their own optimiser group (``loss``) and are saved in checkpoints.
        optimizer: ``partial`` of a torch optimizer without ``params`` (``conf/optimizer``).
        scheduler: ``partial`` of a factory in :mod:`aggzoo.training.schedulers` or ``None``.
        lr_multipliers, no_weight_decay: added to what the heads declare; see :func:`parameter_groups`.
        val_sets: name -> (num_database, positives) of each validation set, in the order of
            the data module's validation loaders; a third item ``True`` marks a set searched against itself
            (``RetrievalSet.queries_are_database``, the metric-learning protocol: its loader holds the
            ``num_database`` images once, and each query's own image is left out of its results).
        recall_ks: the k of the logged Recall@k.
        head_fp32: run the head in fp32 with autocast off (the backbone stays in mixed precision).
            The heads already keep their delicate operations (GeM's power, Sinkhorn, softmax
            pooling) in fp32; this puts the whole head there.
        gather_loss: under DDP, compute the loss over the descriptors of all ranks (gathered with
            their gradients), so the miner sees the global P x K batch exactly as on one device.
        gradient_checkpointing: see :func:`enable_gradient_checkpointing`.
        compile: ``torch.compile`` the model in place (state_dict keys unchanged); ``True`` or a
            dict of ``torch.compile`` keyword arguments (``{"mode": "max-autotune"}``).
    """

    def __init__(self, model: VPRModel, *, loss: MetricLoss | MarginLoss, optimizer: Callable[..., torch.optim.Optimizer],
                 scheduler: Callable[..., Any] | None = None, lr_multipliers: Mapping[str, float] | None = None,
                 no_weight_decay: Sequence[str] = (),
                 val_sets: Mapping[str, tuple[int, Sequence[np.ndarray]]] | None = None,
                 recall_ks: Sequence[int] = (1, 5, 10), head_fp32: bool = False, gather_loss: bool = True,
                 gradient_checkpointing: bool = False, compile: bool | Mapping[str, Any] = False) -> None:
        super().__init__()
        self.model = model
        self.loss = loss
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.lr_multipliers = dict(lr_multipliers or {})
        self.no_weight_decay = list(no_weight_decay)
        self.val_sets = dict(val_sets or {})
        self.recall_ks = tuple(recall_ks)
        self.head_fp32 = head_fp32
        self.gather_loss = gather_loss
        if gradient_checkpointing and not enable_gradient_checkpointing(model):
            raise ValueError(f"gradient checkpointing: backbone {type(model.backbone).__name__} has no "
                             "set_grad_checkpointing(); set model.gradient_checkpointing=false")
        if compile:
            self.model.compile(**(dict(compile) if isinstance(compile, Mapping) else {}))
        self._val_parts: list[list[tuple[Tensor, Tensor]]] = []
        #: name -> ``[Q, k]`` ranked database rows of the last validation (every set covered whole);
        #: what :class:`~aggzoo.training.pictures.ValidationPictures` draws.
        self.val_predictions: dict[str, np.ndarray] = {}
        self._rng_to_restore: Mapping[str, Any] | None = None

    def forward(self, images: Tensor) -> Tensor:
        return self.describe(images)

    def describe(self, images: Tensor) -> Tensor:
        """``images [B, 3, H, W] -> descriptors [B, D]`` (the head in fp32 when ``head_fp32``)."""
        if not self.head_fp32:
            return self.model(images)
        features = self.model.backbone(images)
        with torch.autocast(device_type=images.device.type, enabled=False):
            return self.model.head(_features_to_float(features))

    # -- set-up ------------------------------------------------------------------------------------
    def on_fit_start(self) -> None:
        # Lightning does not call train() at fit start, and a freshly built backbone has its frozen
        # stages in training mode: train() applies the backbone's rule (frozen stages stay in eval, so
        # their batch-norm statistics do not drift). Lightning then restores these modes after every
        # validation.
        self.model.train()
        # Callbacks' on_fit_start (data-driven head init) ran on every rank before this hook; rank 0's
        # result wins so all replicas start identical even if k-means differs in the last bit.
        if self.trainer.world_size > 1 and self.trainer.ckpt_path is None:
            with torch.no_grad():
                for tensor in [*self.model.parameters(), *self.model.buffers()]:
                    tensor.copy_(self.trainer.strategy.broadcast(tensor, src=0))

    # -- training ----------------------------------------------------------------------------------
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        sampler = getattr(self.trainer.datamodule, "train_sampler", None) if self.trainer.datamodule else None
        if sampler is not None:
            sampler.mark_batch_started(self.trainer.num_training_batches)

    def training_step(self, batch: tuple[Tensor, Tensor] | Mapping[str, tuple[Tensor, Tensor]],
                      batch_idx: int) -> Tensor:
        if isinstance(batch, Mapping):
            return self._clique_training_step(batch)
        images, labels = batch  # [P_local, K, 3, H, W], [P_local, K]
        labels = labels.flatten()
        if getattr(self.loss, "reads_head_outputs", False):
            return self._head_outputs_step(images.flatten(0, 1), labels)
        descriptors = self.describe(images.flatten(0, 1))
        loss = self._half_loss(descriptors, labels)
        self.log("train/loss", loss, prog_bar=True, batch_size=labels.numel())
        if isinstance(self.loss, MetricLoss):  # a margin loss mines nothing
            self.log("train/mined_fraction", self.loss.last_mined_fraction, batch_size=labels.numel())
        # No rescaling under gather_loss: every rank computes the same global loss L, the all-gather's
        # backward sums the W ranks' dL/d(own rows) (W x the true gradient) and DDP's mean divides by W.
        return loss

    def _head_outputs_step(self, images: Tensor, labels: Tensor) -> Tensor:
        """A loss over the head's whole output record (FoL's :class:`~aggzoo.training.losses.FoLLoss`: local
        features, region weights, attention), on this rank's batch; each term logged as ``train/<term>_loss``."""
        loss = self.loss(self.model.head.outputs(self.model.backbone(images)), labels)
        self.log("train/loss", loss, prog_bar=True, batch_size=labels.numel())
        for name, value in getattr(self.loss, "last_terms", {}).items():
            self.log(f"train/{name}_loss", value, batch_size=labels.numel())
        self.log("train/mined_fraction", self.loss.last_mined_fraction, batch_size=labels.numel())
        return loss

    def _half_loss(self, descriptors: Tensor, labels: Tensor) -> Tensor:
        """The metric loss of ``[B, D]`` descriptors and ``[B]`` labels, over all ranks under ``gather_loss``."""
        if self.gather_loss and self.trainer.world_size > 1:
            # [W, B, D] with gradients flowing back to each rank's own rows; rank-major order is the
            # single-process batch order (the sampler gives rank r the r-th slice of the global batch).
            descriptors = self.all_gather(descriptors, sync_grads=True).flatten(0, 1)
            labels = self.all_gather(labels).flatten(0, 1)
        return self.loss(descriptors, labels)

    def _clique_training_step(self, batch: Mapping[str, tuple[Tensor, Tensor]]) -> Tensor:
        """SALAD-CM's step (serizba/cliquemining ``VPRModel.training_step``): the places and the clique
        slots in one forward pass, the metric loss of each half on its own, summed."""
        (places, place_labels), (cliques, clique_labels) = batch["places"], batch["cliques"]
        split = places.shape[0] * places.shape[1]
        descriptors = self.describe(torch.cat([places, cliques]).flatten(0, 1))
        place_loss = self._half_loss(descriptors[:split], place_labels.flatten())
        place_mined = self.loss.last_mined_fraction
        clique_loss = self._half_loss(descriptors[split:], clique_labels.flatten())
        loss = place_loss + clique_loss
        count = descriptors.shape[0]
        self.log("train/loss", loss, prog_bar=True, batch_size=count)
        self.log("train/place_loss", place_loss, batch_size=split)
        self.log("train/clique_loss", clique_loss, batch_size=count - split)
        self.log("train/mined_fraction", place_mined, batch_size=split)
        self.log("train/clique_mined_fraction", self.loss.last_mined_fraction, batch_size=count - split)
        return loss

    def configure_optimizers(self) -> Any:
        base_lr = getattr(self.optimizer_factory, "keywords", {}).get("lr")
        if base_lr is None:
            raise ValueError("the optimizer config must set lr")
        groups = parameter_groups(self.model, base_lr=base_lr, lr_multipliers=self.lr_multipliers,
                                  no_weight_decay=self.no_weight_decay)
        optimizer = self.optimizer_factory([*groups, *loss_parameter_groups(self.loss, base_lr=base_lr)])
        if self.scheduler_factory is None:
            return optimizer
        total_steps, steps_per_epoch = self._run_length()
        scheduler = self.scheduler_factory(optimizer, total_steps=total_steps, steps_per_epoch=steps_per_epoch)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def _run_length(self) -> tuple[int, int]:
        """(optimisation steps of the run, per epoch), as ``Trainer.estimated_stepping_batches``
        computes them, but from the data module's batch count: asking the trainer would build the
        training loader before a checkpoint is restored, and Lightning then never restores the
        loader's position into it (the resumed epoch would start again from its first batch)."""
        trainer = self.trainer
        count = getattr(trainer.datamodule, "train_batches_per_epoch", None)
        if not callable(count):
            total = int(trainer.estimated_stepping_batches)
            return total, max(1, math.ceil(total / max(1, trainer.max_epochs or 1)))
        batches = count()
        limit = trainer.limit_train_batches
        batches = min(batches, int(limit)) if isinstance(limit, int) else int(batches * float(limit))
        steps_per_epoch = max(1, math.ceil(batches / trainer.accumulate_grad_batches))
        total = steps_per_epoch * max(1, trainer.max_epochs or 1)
        if trainer.max_steps is not None and trainer.max_steps != -1:
            total = min(total, trainer.max_steps) if (trainer.max_epochs or -1) != -1 else trainer.max_steps
        return total, steps_per_epoch

    # -- never lose a run --------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        states = [rng_state()]
        if self.trainer.world_size > 1:
            gathered: list[Any] = [None] * self.trainer.world_size
            torch.distributed.all_gather_object(gathered, states[0])
            states = gathered
        checkpoint[RNG_STATE_KEY] = states

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        states = checkpoint.get(RNG_STATE_KEY)
        if states:
            rank = self.trainer.global_rank if self._trainer is not None else 0
            self._rng_to_restore = states[rank] if rank < len(states) else states[0]

    def on_train_start(self) -> None:
        # Restored here, after everything that runs between loading the checkpoint and the first
        # step (model set-up, callbacks) has drawn from the RNGs.
        if self._rng_to_restore is not None:
            set_rng_state(self._rng_to_restore)
            self._rng_to_restore = None

    # -- validation --------------------------------------------------------------------------------
    def on_validation_epoch_start(self) -> None:
        self._val_parts = [[] for _ in self.val_sets]
        self.val_predictions = {}

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        images, indices = batch
        self._val_parts[dataloader_idx].append((indices.detach(), self.describe(images).detach().float()))

    def _gather_rows(self, parts: list[tuple[Tensor, Tensor]], total: int) -> Tensor | None:
        """This rank's (row indices, descriptors) -> the full ``[total, D]`` matrix assembled from
        every rank, or ``None`` when some rows were never computed (limited validation batches)."""
        device = self.device
        if parts:
            rows = torch.cat([p[0] for p in parts]).to(device)
            descs = torch.cat([p[1] for p in parts]).to(device)
        else:
            rows = torch.zeros(0, dtype=torch.long, device=device)
            descs = torch.zeros(0, self.model.out_dim, device=device)
        if self.trainer.world_size > 1:
            # Ranks may hold different counts: pad to the largest, gather, drop the padding.
            count = torch.tensor([rows.numel()], device=device)
            counts = self.all_gather(count).flatten()
            width = int(counts.max())
            rows = torch.nn.functional.pad(rows, (0, width - rows.numel()), value=-1)
            descs = torch.nn.functional.pad(descs, (0, 0, 0, width - descs.shape[0]))
            rows = self.all_gather(rows).flatten(0, 1)
            descs = self.all_gather(descs).flatten(0, 1)
            keep = rows >= 0
            rows, descs = rows[keep], descs[keep]
        if rows.numel() == 0:
            return None
        full = torch.zeros(total, descs.shape[1], device=descs.device)
        seen = torch.zeros(total, dtype=torch.bool, device=descs.device)
        full[rows] = descs  # the distributed sampler's padding repeats rows with identical values
        seen[rows] = True
        return full if bool(seen.all()) else None

    def on_validation_epoch_end(self) -> None:
        from aggzoo.evaluation.metrics.recall import recall_at_k
        from aggzoo.evaluation.search import search, search_without_self

        for index, (name, (num_db, positives, *self_searched)) in enumerate(self.val_sets.items()):
            self_searched = bool(self_searched and self_searched[0])
            parts = self._val_parts[index] if index < len(self._val_parts) else []
            full = self._gather_rows(parts, num_db if self_searched else num_db + len(positives))
            if full is None:  # limited validation batches (sanity check, limit_val_batches)
                log.info("validation on %s covered only part of the set: Recall@k not computed", name)
                continue
            descriptors = full.cpu().numpy()
            candidates = num_db - int(self_searched)  # a query is not its own candidate
            k = min(max(self.recall_ks), candidates)
            predictions = (search_without_self(descriptors, k) if self_searched
                           else search(descriptors[:num_db], descriptors[num_db:], k))
            self.val_predictions[name] = predictions
            # The one rule of evaluation.metrics.recall.ks_beyond_database: a k above the set's size is R@num_db.
            recalls = recall_at_k(predictions, positives, ks=self.recall_ks, num_database=candidates)
            for k_, value in recalls.items():
                self.log(f"val/{name}/R@{k_}", value, prog_bar=(k_ == 1), add_dataloader_idx=False, sync_dist=True)
            if index == 0:
                # The metric checkpoints and early stopping monitor, whatever the set is called.
                self.log("val/R@1", recalls[1], add_dataloader_idx=False, sync_dist=True)
        self._val_parts = []
