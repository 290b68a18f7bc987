"""WiSE-FT: keep the weights fine-tuning started from, and ship a mix of them and the fine-tuned ones.

Weight-space ensembling (Wortsman et al., "Robust fine-tuning of zero-shot models", CVPR 2022):
the model that is evaluated and shipped is ``(1 - alpha) * theta_start + alpha * theta_trained``,
where ``theta_start`` is the model before its first step (the ImageNet backbone and the head after
its data-driven initialisation, e.g. NetVLAD's k-means centres). Fine-tuning on a small or narrow
training set moves the weights far from features that generalise; the mix keeps most of the
in-domain gain and much of the start's accuracy elsewhere.

    python train.py callbacks.weight_ensembling.alpha=0.5

Training itself is unchanged: the optimiser, the validation that picks the best checkpoint and a
resumed run all see the fine-tuned weights. Each checkpoint also records ``theta_start`` and
``alpha`` (:data:`aggzoo.hub.ensembling.ENSEMBLING_KEY`), and every reader that builds a model from the
file (the test of the best checkpoint, ``eval.py ckpt_path=``, ``create_model(checkpoint_path=)``,
``manifest add``) gets the mix, through :meth:`aggzoo.hub.checkpoint.CheckpointFile.state_dict`.
The record's format and the mix live in :mod:`aggzoo.hub.ensembling` (below training, so that every
reader applies it without importing Lightning); this callback writes the record (and reads its start back
on resume).
``alpha = 1`` (the default) records nothing and changes nothing.
"""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
from torch import Tensor, nn

from aggzoo.hub.ensembling import ENSEMBLING_KEY, ensembling_record, is_ensembling_alpha

__all__ = ["WeightEnsembling"]

log = logging.getLogger(__name__)


class WeightEnsembling(L.Callback):
    """Record the weights at the start of training and the mixing coefficient in every checkpoint.

    Args:
        alpha: weight of the fine-tuned model in ``(1 - alpha) * start + alpha * trained``, in
            ``[0, 1]``; ``1`` turns the callback off.
    """

    def __init__(self, alpha: float = 1.0) -> None:
        if not is_ensembling_alpha(alpha):
            raise ValueError(f"callbacks.weight_ensembling.alpha must be a number in [0, 1], got {alpha!r}")
        self.alpha = float(alpha)
        self.start: dict[str, Tensor] | None = None

    @property
    def enabled(self) -> bool:
        return self.alpha < 1.0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # After every on_fit_start (the heads' data-driven initialisation), before the first step. A
        # resumed run keeps the start its checkpoint recorded (on_load_checkpoint runs before this).
        if self.enabled and self.start is None:
            # Only what training can change: frozen parameters equal their start, and a key the record
            # lacks stays as trained (hub.ensembling.ensembled_state), so keeping them would only grow every
            # checkpoint (a frozen DINOv2 ViT-L is 1.2 GB). Floating buffers (BatchNorm statistics) are kept.
            model = pl_module.model
            trainable = {name for name, p in model.named_parameters(remove_duplicate=False) if p.requires_grad}
            self.start = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict(keep_vars=True).items()
                          if v.is_floating_point() and (k in trainable or not isinstance(v, nn.Parameter))}
            log.info("weight ensembling: kept the starting weights (%d tensors); checkpoints record "
                     "alpha=%g", len(self.start), self.alpha)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        if self.enabled and self.start is not None:
            checkpoint[ENSEMBLING_KEY] = {"alpha": self.alpha, "start": self.start}

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        record = ensembling_record(checkpoint)
        if self.enabled and record is not None:
            self.start = dict(record["start"])
            if float(record["alpha"]) != self.alpha:
                log.warning("weight ensembling: the resumed checkpoint recorded alpha=%g; this run records %g",
                            float(record["alpha"]), self.alpha)
