"""Metric-learning objective: a pytorch-metric-learning loss and its miner, injected from config."""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["MetricLoss"]


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
