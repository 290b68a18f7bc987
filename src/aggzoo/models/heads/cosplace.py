"""CosPlace / EigenPlaces head: GeM pooling of L2-normalised features and a linear projection.

G. Berton, C. Masone, B. Caputo, "Rethinking Visual Geo-localization for Large-Scale
Applications", CVPR 2022, arXiv:2204.02287. Original code: gmberton/CosPlace
``cosplace_model/cosplace_network.py`` (MIT). EigenPlaces (G. Berton, G. Trivigno, B. Caputo,
C. Masone, "EigenPlaces: Training Viewpoint Robust Models for Visual Place Recognition",
ICCV 2023, arXiv:2308.10832; gmberton/EigenPlaces, MIT) uses the same head and differs only in
training. Re-implemented from the papers, with defaults and state-dict names checked against
the code.

``x: [B, C, H, W] -> L2 over C -> GeM (p learnable, init 3) -> [B, C] -> Linear(C -> D) -> L2
-> [B, D]``.

The five steps sit in one ``nn.Sequential`` called ``aggregation`` in the original order, so the
state-dict keys are the original ones: ``aggregation.1.p`` (GeM exponent) and
``aggregation.3.{weight,bias}`` (the projection), and official checkpoints load 1:1.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from aggzoo.layers.pooling import GEM_P_LR_MULTIPLIER, GeMPool
from aggzoo.models.features import Features
from aggzoo.models.heads.base import Head

__all__ = ["CosPlace"]


class _L2Normalize(nn.Module):
    """L2-normalise along dimension 1 (channels of a map, or features of a vector)."""

    def forward(self, x: Tensor) -> Tensor:
        return F.normalize(x, dim=1)


class CosPlace(Head):
    """CosPlace / EigenPlaces head.

    Args:
        in_channels: ``C`` of the last map (2048 for the released ResNet-50/101 after layer4).
        out_dim: ``D``, the descriptor size (training default 512; released ResNet-50/101 models
            go up to 2048).
        p: initial GeM exponent (learned; init 3; 10x learning rate and no weight decay, as GeM).
        eps: GeM clamp floor.

    Shapes: ``Features(maps=(..., [B, C, H, W])) -> [B, D]``.
    """

    def __init__(self, in_channels: int, *, out_dim: int = 512, p: float = 3.0, eps: float = 1e-6) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.out_dim = out_dim
        # Indices 1 and 3 carry the parameters; 0, 2 and 4 are parameter-free but keep them there.
        self.aggregation = nn.Sequential(
            _L2Normalize(),
            GeMPool(p=p, eps=eps),
            nn.Flatten(1),  # GeM already returns [B, C]; kept so the indices match the original
            nn.Linear(in_channels, out_dim),
            _L2Normalize(),
        )

    def forward(self, features: Features) -> Tensor:
        return self.aggregation(features.last)

    def no_weight_decay(self) -> set[str]:
        return {"aggregation.1.p"}

    def lr_multipliers(self) -> dict[str, float]:
        return {"aggregation.1.p": GEM_P_LR_MULTIPLIER}
