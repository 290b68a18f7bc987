"""GeM followed by a learned linear projection (a "whitening" FC layer): the global head of the landmark-retrieval
ResNets of CVNet and of cnnimageretrieval-pytorch's ``*-gem-w`` networks.

- CVNet (S. Lee, H. Seong, S. Lee, E. Kim, "Correlation Verification for Image Retrieval", CVPR 2022,
  arXiv:2204.01458; sungonce/CVNet ``model/resnet.py`` ``GlobalHead``, MIT, itself from DELG-pytorch):
  ``x: [B, C, H, W] -> GeM (p learned, init 3, eps 1e-6) -> FC [C -> D] -> L2``
  (``CVNet_Rerank.extract_global_descriptor`` normalises the FC output): ``l2_before_fc=False``.
- F. Radenovic, G. Tolias, O. Chum, "Fine-tuning CNN Image Retrieval with No Human Annotation", TPAMI 2018,
  arXiv:1711.02512 (filipradenovic/cnnimageretrieval-pytorch ``cirtorch/networks/imageretrievalnet.py``, MIT):
  ``GeM -> L2 -> whiten (FC, initialised from learned whitening) -> L2``: ``l2_before_fc=True``.

SuperGlobal (Shao et al., ICCV 2023, arXiv:2308.06954) swaps the pooling of the CVNet head for its GeM+ with
regional GeM and L2-normalises before the FC (ShihaoShao-GH/SuperGlobal ``model/resnet.py``
``_forward_singlescale``): :meth:`GeMFC.with_superglobal_pooling`, applied at test time by
:func:`aggzoo.models.superglobal.superglobal_model`.
"""

from __future__ import annotations

import copy

import torch.nn.functional as F
from torch import Tensor, nn

from aggzoo.layers.pooling import GEM_P_LR_MULTIPLIER, GeMPool
from aggzoo.models.features import Features
from aggzoo.models.heads.base import Head
from aggzoo.models.heads.gemplus import GeMPlus

__all__ = ["GeMFC"]


class GeMFC(Head):
    """GeM pooling, a linear projection ``W x + b`` and L2.

    Args:
        in_channels: ``C`` of the last map.
        out_dim: ``D``, the projection's output size (CVNet: 2048, ``REDUCTION_DIM``; cirtorch ``-w``: C).
        p: initial GeM exponent (3 in both papers; learned).
        eps: GeM clamp floor (1e-6 in both codes).
        l2_before_fc: L2-normalise the pooled vector before the projection (cirtorch, SuperGlobal) or not (CVNet).

    Shapes: ``Features(maps=(..., [B, C, H, W])) -> [B, D]`` unit-norm rows.
    """

    def __init__(self, in_channels: int, *, out_dim: int = 2048, p: float = 3.0, eps: float = 1e-6,
                 l2_before_fc: bool = False) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.out_dim = out_dim
        self.l2_before_fc = l2_before_fc
        self.pool: nn.Module = GeMPool(p=p, eps=eps, learn_p=True)
        self.fc = nn.Linear(in_channels, out_dim)

    def forward(self, features: Features) -> Tensor:
        if isinstance(self.pool, Head):  # SuperGlobal's GeM+ (a head of its own: regional GeM, GeM+, L2)
            pooled = self.pool(features)
        else:
            pooled = self.pool(features.last)
            if self.l2_before_fc:
                pooled = F.normalize(pooled, dim=-1)
        return F.normalize(self.fc(pooled), dim=-1)

    def with_superglobal_pooling(self) -> GeMFC:
        """A copy pooling as SuperGlobal does on CVNet: regional GeM (p 2.5, 5x5), GeM+ (p fixed at 4.6, eps
        1e-8) and L2 in place of the learned GeM, then this head's projection (shared values, copied)."""
        head = copy.deepcopy(self)
        head.pool = GeMPlus(self.in_channels)
        head.l2_before_fc = True
        return head

    @property
    def min_positions(self) -> int:
        return self.pool.min_positions if isinstance(self.pool, Head) else 1

    def no_weight_decay(self) -> set[str]:
        return {"pool.p"}

    def lr_multipliers(self) -> dict[str, float]:
        return {"pool.p": GEM_P_LR_MULTIPLIER}
