"""Training objectives injected from config: a pytorch-metric-learning pair loss and its miner
(:class:`MetricLoss`), a margin classification loss with its own class weights (:class:`MarginLoss`),
and SelaVPR++'s hashing objective (:class:`HashingLoss`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["HashingLoss", "MarginLoss", "MetricLoss", "loss_parameter_groups"]


class MetricLoss(nn.Module):
    """``loss(descriptors [N, D], labels [N]) -> scalar``, mining pairs first when a miner is set.

    Args:
        loss: a ``pytorch_metric_learning.losses`` object (e.g. ``MultiSimilarityLoss(alpha=1,
            beta=50, base=0)``, the GSV-Cities recipe).
        miner: a ``pytorch_metric_learning.miners`` object (``MultiSimilarityMiner(epsilon=0.1)``)
            or ``None``.

    ``last_mined_fraction`` records the fraction of the batch's images that appear in a mined
    pair, which the training module logs (upstream's "b_acc" signal of how hard the batch was).
    """

    def __init__(self, loss: nn.Module, miner: nn.Module | None = None) -> None:
        super().__init__()
        self.loss = loss
        self.miner = miner
        self.last_mined_fraction = 1.0

    def forward(self, descriptors: Tensor, labels: Tensor) -> Tensor:
        # Similarities, mining margins and exp(beta * s) in fp32: casting the input is not enough under
        # autocast, which would run the loss's matmul in bf16/fp16 again (s to ~3 digits, beta = 50).
        with torch.autocast(device_type=descriptors.device.type, enabled=False):
            descriptors = descriptors.float()
            if self.miner is None:
                return self.loss(descriptors, labels)
            pairs = self.miner(descriptors, labels)
            used = (torch.unique(torch.cat([t for t in pairs if t.numel()])) if any(t.numel() for t in pairs)
                    else labels[:0])
            self.last_mined_fraction = used.numel() / max(1, labels.numel())
            return self.loss(descriptors, labels, pairs)


class HashingLoss(nn.Module):
    """SelaVPR++'s objective for its hashing branch (Lu-Feng/SelaVPRplusplus ``train_rerank.py``, MIT;
    re-implemented): ``loss(z [N, bits], b [N, bits], labels [N]) -> scalar``,

        L = MS(b) + weight * mean_{(i, j) mined} (z_i . z_j - b_i . b_j / bits)^2

    with ``z`` the unit-norm hashing embedding, ``b = sign(z)`` its codes (straight-through, so both terms train
    ``z``), the pairs mined on ``b`` by ``miner`` (MultiSimilarityMiner, cosine: positive and negative pairs
    together) and ``MS`` the metric loss on ``b`` with those pairs (MultiSimilarityLoss; its distance normalises
    ``b`` to ``b / sqrt(bits)``). ``weight`` is upstream's 0.1. Without mined pairs the second term is 0 (upstream
    would average an empty tensor).
    """

    def __init__(self, loss: nn.Module, miner: nn.Module, *, weight: float = 0.1) -> None:
        super().__init__()
        self.loss = loss
        self.miner = miner
        self.weight = weight

    def forward(self, z: Tensor, b: Tensor, labels: Tensor) -> Tensor:
        with torch.autocast(device_type=z.device.type, enabled=False):
            z, b = z.float(), b.float()
            anchors_pos, positives, anchors_neg, negatives = self.miner(b, labels)
            metric = self.loss(b, labels, (anchors_pos, positives, anchors_neg, negatives))
            left, right = torch.cat([anchors_pos, anchors_neg]), torch.cat([positives, negatives])
            if left.numel() == 0:
                return metric + 0.0 * z.sum()
            gap = (z[left] * z[right]).sum(-1) - (b[left] * b[right]).sum(-1) / b.shape[1]
            return metric + self.weight * gap.pow(2).mean()


class MarginLoss(nn.Module):
    """A classification loss with a margin and its own class weights: ``loss(descriptors [N, D],
    labels [N]) -> scalar``, labels in ``0 .. num_classes-1``.

    The losses are pytorch-metric-learning's ``ArcFaceLoss`` (Deng et al., CVPR 2019), ``CosFaceLoss``
    (Wang et al., CVPR 2018) and ``SubCenterArcFaceLoss`` (Deng et al., ECCV 2020), which hold the class
    weights ``W [D, num_classes]`` (``[D, num_classes * sub_centers]``). Those weights train with the
    model (they are in the training checkpoint, so a resumed run continues them) but are no part of
    the retrieval model: :func:`aggzoo.hub.checkpoint.unwrap_checkpoint`, export and ``save_pretrained``
    keep only ``model.*``. They get their own optimiser group (:func:`loss_parameter_groups`), with the
    learning rate and weight decay the recipe gives them.

    Units: pytorch-metric-learning's ArcFace margin is in **degrees** (``numpy.radians`` inside);
    CosFace's is a cosine offset. Configs state the paper's value and its unit beside the number.

    Args:
        loss: ``partial`` of the loss without its sizes (``conf/loss/arcface.yaml``); called with
            ``num_classes`` and ``embedding_size``.
        num_classes: ``C``, from the training data (:attr:`~aggzoo.data.class_batches.ClassImagesDataset.num_classes`).
        embedding_size: ``D``, the descriptor size (the model's ``out_dim``).
        lr_multiplier: the class weights' learning rate as a factor of the optimiser's.
        weight_decay: their weight decay (``None``: the optimiser's).
    """

    def __init__(self, loss: Callable[..., nn.Module], *, num_classes: int, embedding_size: int,
                 lr_multiplier: float = 1.0, weight_decay: float | None = 0.0) -> None:
        super().__init__()
        self.loss = loss(num_classes=num_classes, embedding_size=embedding_size)
        self.num_classes = num_classes
        self.lr_multiplier = float(lr_multiplier)
        self.weight_decay = weight_decay

    def forward(self, descriptors: Tensor, labels: Tensor) -> Tensor:
        # Cosines, margins and the scaled softmax in fp32 (scale ~45-64 makes half precision logits coarse).
        with torch.autocast(device_type=descriptors.device.type, enabled=False):
            return self.loss(descriptors.float(), labels)


def loss_parameter_groups(loss: nn.Module, *, base_lr: float) -> list[dict[str, Any]]:
    """The optimiser group of a loss's own trainable parameters (a :class:`MarginLoss`'s class weights),
    named ``loss``: ``[]`` for a loss without parameters (:class:`MetricLoss`)."""
    params = [p for p in loss.parameters() if p.requires_grad]
    if not params:
        return []
    group: dict[str, Any] = {"params": params, "lr": base_lr * float(getattr(loss, "lr_multiplier", 1.0)),
                             "name": "loss"}
    weight_decay = getattr(loss, "weight_decay", None)
    if weight_decay is not None:
        group["weight_decay"] = float(weight_decay)
    return [group]
