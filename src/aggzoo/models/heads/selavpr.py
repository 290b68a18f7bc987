"""SelaVPR: a GeM global descriptor and dense local features for mutual-nearest-neighbour re-ranking.

F. Lu, L. Zhang, X. Lan, S. Dong, Y. Wang, C. Yuan, "Towards Seamless Adaptation of Pre-trained
Models for Visual Place Recognition" (SelaVPR), ICLR 2024, arXiv:2402.14505. Original code:
Lu-Feng/SelaVPR ``network.py`` (``GeoLocalizationNet``, ``LocalAdapt``) and ``local_matching.py`` (MIT);
read for the computation, defaults and state-dict names only.

On the final-norm patch map ``x: [B, C, H, W]`` of the adapted DINOv2
(:mod:`aggzoo.models.backbones.sela_adapter`):

- global (``forward``): ``L2(GeM(L2_c(x)))``, learnable ``p`` (init 3): ``[B, C]`` (1024 on ViT-L);
- local (:meth:`SelaVPR.local_features`, the "local adaptation"): ``ConvTranspose2d(C -> 256, k3 s2 p1)``
  -> ReLU -> ``ConvTranspose2d(256 -> 128, k3 s2 p1)``, L2 per location: ``[B, 4H-3, 4W-3, 128]``
  (16 x 16 -> 61 x 61, 3721 local features at 224 x 224). Re-ranking of a global shortlist by the
  number of mutual nearest neighbours of these features: :mod:`aggzoo.evaluation.local_rerank`.

Upstream views the patch tokens as 16 x 16 (224 x 224 inputs only); here the map keeps its own size.
Upstream trains the local branch with its own loss on mutual-nearest-neighbour similarities, which
aggzoo's trainer does not have: the local branch is frozen unless ``train_local=True`` (then a loss
must use :meth:`local_features`, or its parameters get no gradient).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from aggzoo.layers.pooling import GeMPool
from aggzoo.models.features import Features
from aggzoo.models.heads.base import Head

__all__ = ["LocalAdapt", "SelaVPR"]


class LocalAdapt(nn.Module):
    """``[B, C, H, W] -> [B, l, 4H-3, 4W-3]``: two stride-2 transposed convolutions with a ReLU between
    (upstream names ``upconv1``, ``upconv2``)."""

    def __init__(self, in_channels: int, hidden_dim: int = 256, out_dim: int = 128) -> None:
        super().__init__()
        self.upconv1 = nn.ConvTranspose2d(in_channels, hidden_dim, kernel_size=3, stride=2, padding=1)
        self.upconv2 = nn.ConvTranspose2d(hidden_dim, out_dim, kernel_size=3, stride=2, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        return self.upconv2(F.relu(self.upconv1(x)))


class SelaVPR(Head):
    """SelaVPR head: the global descriptor from :meth:`forward`, local features from :meth:`local_features`.

    Args:
        in_channels: ``C`` of the patch map (1024 for DINOv2 ViT-L/14).
        p: initial GeM exponent (learned; paper 3).
        local_hidden: channels after the first transposed convolution (paper 256).
        local_dim: ``l``, the local feature size (paper 128).
        train_local: let the local branch train (it needs SelaVPR's local loss; see the module docstring).

    Shapes: ``Features(maps=(..., [B, C, H, W])) -> [B, C]``; ``local_features -> [B, 4H-3, 4W-3, l]``.
    State-dict names: ``gem.p`` (upstream ``aggregation.1.p``), ``local_adapt.upconv{1,2}`` (upstream
    ``LocalAdapt.upconv{1,2}``).
    """

    def __init__(self, in_channels: int, *, p: float = 3.0, local_hidden: int = 256, local_dim: int = 128,
                 train_local: bool = False) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.out_dim = in_channels
        self.local_dim = local_dim
        self.gem = GeMPool(p=p)
        self.local_adapt = LocalAdapt(in_channels, local_hidden, local_dim)
        self.local_adapt.requires_grad_(train_local)

    def no_weight_decay(self) -> set[str]:
        return {"gem.p"}

    def forward(self, features: Features) -> Tensor:
        return F.normalize(self.gem(F.normalize(features.last, dim=1)), dim=1)

    def local_features(self, features: Features) -> Tensor:
        """``[B, 4H-3, 4W-3, l]`` dense local features, unit norm at every location."""
        return F.normalize(self.local_adapt(features.last).permute(0, 2, 3, 1), dim=-1)
