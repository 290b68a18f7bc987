"""GeM+: generalized-mean pooling with the fixed exponent found by SuperGlobal.

S. Shao, K. Chen, A. Karpur, Q. Cui, A. Araujo, B. Cao, "Global Features are All You Need for
Image Retrieval and Reranking", ICCV 2023, arXiv:2308.06954. Original code:
ShihaoShao-GH/SuperGlobal ``modules/coarse_retrieval/gemp.py`` (MIT); re-implemented from the
paper, with the defaults checked against that code.

SuperGlobal observes that a GeM exponent learned jointly with an ArcFace loss is sub-optimal and
fixes it instead (``p = 4.6``, eps ``1e-8`` in the authors' code):
``x: [B, C, H, W] -> (mean_i clamp(x_i, eps)^p)^(1/p) -> L2 -> [B, C]``.

The multi-scale part of SuperGlobal (scale-GeM: elementwise max of the descriptors at scales
1/sqrt(2), 1, sqrt(2)) is a test-time wrapper of a whole model:
``MultiScale(model, reduce="max", interpolation="bilinear")``
(:class:`aggzoo.models.multiscale.MultiScale`). Its reranking belongs to evaluation.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from aggzoo.layers.pooling import GeMPool
from aggzoo.models.features import Features
from aggzoo.models.heads.base import Head

__all__ = ["GeMPlus"]


class GeMPlus(Head):
    """GeM+ head: GeM with a fixed (not learned) exponent, then L2.

    Args:
        in_channels: ``C`` of the last map; ``D = C``.
        p: the fixed exponent (paper: 4.6).
        eps: clamp floor that keeps ``x^p`` defined for non-positive activations (paper code: 1e-8).

    Shapes: ``Features(maps=(..., [B, C, H, W])) -> [B, C]``.
    """

    def __init__(self, in_channels: int, *, p: float = 4.6, eps: float = 1e-8) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.out_dim = in_channels
        self.pool = GeMPool(p=p, eps=eps, learn_p=False)

    def forward(self, features: Features) -> Tensor:
        return F.normalize(self.pool(features.last), dim=-1)
