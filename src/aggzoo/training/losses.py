"""Metric-learning objective: a pytorch-metric-learning loss and its miner, injected from config."""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["HashingLoss", "MetricLoss"]


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
