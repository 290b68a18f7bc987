"""MegaLoc: SALAD with wider clusters and a linear projection to 8448-D.

G. Berton, C. Masone, "MegaLoc: One Retrieval to Place Them All", CVPR 2025 workshops,
arXiv:2502.17237. Original code: gmberton/MegaLoc ``megaloc_model.py`` (MIT); followed for the
structure, defaults and state_dict names, no code taken from it.

``desc = L2(Linear(m*l + g -> D)(SALAD(f, t)))`` with m=64, l=256, g=256 (SALAD's own output,
already L2-normalised, is 16640-D) and D=8448. Upstream keys ``aggregator.agg.*`` (the SALAD part,
same names as :class:`~aggzoo.models.heads.salad.SALAD`) and ``aggregator.linear.*`` map to
``head.agg.*`` and ``head.linear.*`` here.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from aggzoo.models.features import Features
from aggzoo.models.heads.base import Head
from aggzoo.models.heads.salad import SALAD

__all__ = ["MegaLoc"]


class MegaLoc(Head):
    """MegaLoc head: a :class:`SALAD` followed by a linear projection.

    Args:
        in_channels: ``C`` of the patch map and CLS token (768 for DINOv2 ViT-B/14).
        num_clusters: ``m`` (64).
        cluster_dim: ``l`` (256, twice SALAD's).
        token_dim: ``g`` (256).
        feat_dim: ``D``, the output dimension of the projection (8448, SALAD's size).
        dropout: SALAD's MLP dropout (upstream keeps SALAD's 0.3).

    Shapes: ``Features(maps=(..., [B, C, H, W]), cls=[B, C]) -> [B, D]``, ``H*W > m``.
    """

    needs_cls = True

    def __init__(
        self,
        in_channels: int,
        *,
        num_clusters: int = 64,
        cluster_dim: int = 256,
        token_dim: int = 256,
        feat_dim: int = 8448,
        dropout: float = 0.3,
    ) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.agg = SALAD(in_channels, num_clusters=num_clusters, cluster_dim=cluster_dim, token_dim=token_dim,
                         dropout=dropout)
        self.linear = nn.Linear(self.agg.out_dim, feat_dim)
        self.out_dim = feat_dim

    @property
    def min_positions(self) -> int:
        return self.agg.min_positions

    def forward(self, features: Features) -> Tensor:
        return F.normalize(self.linear(self.agg(features)), dim=-1)
