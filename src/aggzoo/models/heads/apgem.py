"""AP-GeM head: GeM, a fully connected layer, L2 and a fixed PCA-whitening.

J. Revaud, J. Almazan, R. S. Rezende, C. R. de Souza, "Learning with Average Precision: Training Image
Retrieval with a Listwise Loss", ICCV 2019, arXiv:1906.07589. Original code: naver/deep-image-retrieval
(``dirtorch/nets/rmac_resnet.py`` ``ResNet_RMAC``, ``dirtorch/utils/common.py`` ``whiten_features``;
BSD-3-Clause); re-implemented from the code's facts, no code taken from it.

``x: [B, C, H, W] -> GeM (p learnable, init 3) -> [L2 if norm_features] -> Linear(C -> D) -> L2
-> [B, D]``, then, with ``whiten=True``, the whitening learned on Landmarks-clean applied as
``P (x - m)`` (:class:`~aggzoo.layers.whitening.AffineWhitening`) -> L2 -> ``[B, D]``.

The GeM part is the :class:`~aggzoo.models.heads.gem.GeM` head itself (``l2="none"``, or ``"after_pool"``
for ``norm_features``); only the projection and the whitening are this head's own.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from aggzoo.layers.pooling import GEM_P_LR_MULTIPLIER
from aggzoo.layers.whitening import AffineWhitening
from aggzoo.models.features import Features
from aggzoo.models.heads.base import Head
from aggzoo.models.heads.gem import GeM

__all__ = ["APGeM"]


class APGeM(Head):
    """AP-GeM head (dirtorch ``ResNet_RMAC`` with ``pooling="gem"`` and its whitening).

    Args:
        in_channels: ``C`` of the last map (2048 on ResNet-101 layer4).
        out_dim: ``D`` of the fully connected layer (released models: 2048).
        p: initial GeM exponent (dirtorch ``gemp``: 3; learned).
        eps: GeM clamp floor (dirtorch: 1e-6).
        norm_features: L2-normalise the pooled vector before the FC layer (dirtorch's ``norm_features``
            option; default off, as dirtorch's).
        whiten: apply the fixed PCA-whitening ``D -> D`` and a final L2 (how the released models are
            evaluated, ``--whiten Landmarks_clean``).

    Shapes: ``Features(maps=(..., [B, C, H, W])) -> [B, D]``.
    """

    def __init__(self, in_channels: int, *, out_dim: int = 2048, p: float = 3.0, eps: float = 1e-6,
                 norm_features: bool = False, whiten: bool = True) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.out_dim = out_dim
        self.gem = GeM(in_channels, p=p, eps=eps, l2="after_pool" if norm_features else "none")
        self.fc = nn.Linear(in_channels, out_dim)
        self.whiten = AffineWhitening(out_dim, out_dim) if whiten else None

    def forward(self, features: Features) -> Tensor:
        x = F.normalize(self.fc(self.gem(features)), dim=1)
        if self.whiten is None:
            return x
        return F.normalize(self.whiten(x), dim=1)

    def no_weight_decay(self) -> set[str]:
        return {"gem.pool.p"}

    def lr_multipliers(self) -> dict[str, float]:
        return {"gem.pool.p": GEM_P_LR_MULTIPLIER}
