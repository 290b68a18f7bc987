"""GeM+: generalized-mean pooling with the fixed exponent found by SuperGlobal.

S. Shao, K. Chen, A. Karpur, Q. Cui, A. Araujo, B. Cao, "Global Features are All You Need for
Image Retrieval and Reranking", ICCV 2023, arXiv:2308.06954. Original code:
ShihaoShao-GH/SuperGlobal ``modules/coarse_retrieval/gemp.py`` (MIT); re-implemented from the
paper, with the defaults checked against that code.

SuperGlobal observes that a GeM exponent learned jointly with an ArcFace loss is sub-optimal and
fixes it instead (``p = 4.6``, eps ``1e-8`` in the authors' code), after a regional GeM that averages
every position with the power mean (p = 2.5) of its 5x5 window (:func:`aggzoo.layers.pooling.regional_gem`;
the authors' ``rgem``, on by default in their config):
``x: [B, C, H, W] -> rgem -> (mean_i clamp(x_i, eps)^p)^(1/p) -> L2 -> [B, C]``.
``regional=False`` is the GeM+ step alone. (The authors' ResNet then applies its CVNet global head's
FC layer; that layer belongs to their backbone, not to the pooling.)

The multi-scale part of SuperGlobal (scale-GeM: elementwise max of the descriptors at scales
1/sqrt(2), 1, sqrt(2)) is a test-time wrapper of a whole model:
``MultiScale(model, reduce="max", interpolation="bilinear")``
(:class:`aggzoo.models.multiscale.MultiScale`). Its reranking belongs to evaluation.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from aggzoo.layers.pooling import GeMPool, regional_gem
from aggzoo.models.features import Features
from aggzoo.models.heads.base import Head

__all__ = ["GeMPlus"]


class GeMPlus(Head):
    """GeM+ head: GeM with a fixed (not learned) exponent, then L2.

    Args:
        in_channels: ``C`` of the last map; ``D = C``.
        p: the fixed exponent (paper: 4.6).
        eps: clamp floor that keeps ``x^p`` defined for non-positive activations (paper code: 1e-8).
        regional: apply the regional GeM first (authors' default) or only the GeM+ step.
        regional_p, regional_size: its power-mean order (2.5) and window (5).

    Shapes: ``Features(maps=(..., [B, C, H, W])) -> [B, C]``; with ``regional``, H and W >= 3.
    """

    def __init__(self, in_channels: int, *, p: float = 4.6, eps: float = 1e-8, regional: bool = True,
                 regional_p: float = 2.5, regional_size: int = 5) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.out_dim = in_channels
        self.regional = regional
        self.regional_p = regional_p
        self.regional_size = regional_size
        self.pool = GeMPool(p=p, eps=eps, learn_p=False)

    @property
    def min_positions(self) -> int:
        side = self.regional_size // 2 + 1 if self.regional else 1
        return side * side

    def forward(self, features: Features) -> Tensor:
        x = features.last
        if self.regional:
            x = regional_gem(x, self.regional_p, self.regional_size)
        return F.normalize(self.pool(x), dim=-1)
