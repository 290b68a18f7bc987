"""Global average pooling: the baseline every aggregation method is compared with.

``x: [B, C, H, W] -> mean over H, W -> L2 -> [B, C]``.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from aggzoo.models.features import Features
from aggzoo.models.heads.base import Head

__all__ = ["AvgPool"]


class AvgPool(Head):
    """Global average pooling of the last map, L2-normalised. No parameters.

    Shapes: ``Features(maps=(..., [B, C, H, W])) -> [B, C]``.
    """

    def __init__(self, in_channels: int) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.out_dim = in_channels

    def forward(self, features: Features) -> Tensor:
        return F.normalize(features.last.float().mean(dim=(-2, -1)), dim=-1)
