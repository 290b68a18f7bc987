"""ConvAP: convolutional aggregation with adaptive average pooling.

A. Ali-bey, B. Chaib-draa, P. Giguere, "GSV-Cities: Toward Appropriate Supervised Visual Place
Recognition", Neurocomputing 2022, arXiv:2210.10239. Original code: amaralibey/gsv-cities
``models/aggregators/convap.py`` (the repository has no licence file, so all rights are reserved:
this is a re-implementation from the paper's equations; no code was taken from it).

``x: [B, C, H, W] -> Conv1x1(C -> d, bias) -> AdaptiveAvgPool(s1 x s2) -> [B, d, s1, s2]
-> flatten channel-major -> L2 -> [B, d * s1 * s2]``.

The released ResNet-50 models cut the network after layer4 (``C = 2048``, 10 x 10 maps at 320 x 320)
and use ``s1 = s2 = 2`` with ``d`` in {128, 512, 1024, 2048}; the headline model is ``d = 1024``
(4096-D). State-dict names mirror the original (``channel_pool.{weight,bias}``), so official
checkpoints map 1:1 after stripping their ``aggregator.`` prefix.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from aggzoo.models.features import Features
from aggzoo.models.heads.base import Head

__all__ = ["ConvAP"]


class ConvAP(Head):
    """ConvAP head.

    Args:
        in_channels: ``C`` of the last map.
        out_channels: ``d``, the channels of the 1x1 projection (the headline released model's 1024,
            4096-D; upstream's class default is 512, the other released models use 128, 512, 2048).
        s1: output rows of the adaptive average pooling.
        s2: output columns of the adaptive average pooling.

    Shapes: ``Features(maps=(..., [B, C, H, W])) -> [B, d * s1 * s2]``, laid out ``[d, s1, s2]``
    (channel-major, then row, then column).
    """

    def __init__(self, in_channels: int, *, out_channels: int = 1024, s1: int = 2, s2: int = 2) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.s1, self.s2 = s1, s2
        self.out_dim = out_channels * s1 * s2
        self.channel_pool = nn.Conv2d(in_channels, out_channels, kernel_size=1, bias=True)

    def forward(self, features: Features) -> Tensor:
        # The paper's order is conv, then pool. Both are linear, the conv acting on channels alone and
        # the pool on positions alone (each output cell a fixed average), so they commute, bias
        # included: pooling first gives the same descriptor with the conv on s1 x s2 positions
        # instead of H x W.
        x = F.adaptive_avg_pool2d(features.last, (self.s1, self.s2))  # [B, C, s1, s2]
        x = self.channel_pool(x)  # [B, d, s1, s2]
        return F.normalize(x.flatten(1), dim=1)
