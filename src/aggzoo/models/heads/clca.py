"""CLCA: the cross-layer aggregation head of CLCA, with a retrieval projection instead of the classifier.

E. A. Rios, J. C. Yuanda, V. L. Ghanz, C.-W. Yu, B.-C. Lai, M.-C. Hu,
"Cross-Layer Cache Aggregation for Token Reduction in Ultra-Fine-Grained Image Recognition", ICASSP 2025,
arXiv:2501.00243; code arkel23/CLCA (MIT), ``models/vit.py`` (``--ifa_head``). The authors'
head reads the CLS token of several ViT blocks (after each token-reduction block and the last one, no final
norm) stacked as ``X [B, D, L]`` and computes

    Z = GELU( BN_kD( DWConv_{D -> kD, kernel = stride = L, groups = D}( BN_D(X) ) ) )   [B, kD]

i.e. each output channel ``j`` is a learned weighted sum over the ``L`` layers of input channel
``j // k`` (``k`` = ``--ifa_dws_conv_groups``, 2 by default), then a classifier ``Conv1d(kD -> classes, 1)``.
Here that classifier becomes the retrieval projection ``Conv1d(kD -> out_dim, 1)`` (a linear map, the
same layer type and shapes as the authors' classifier) and the descriptor is ``L2(proj(Z))``;
``project=False`` drops the projection and keeps ``L2(Z)`` (kD-D). ``k = 0`` is the authors' other
option, the IFA head: ``Linear(L -> 1)`` over the layers, ReLU, LayerNorm(D), ``Linear(D -> out_dim)``.

The cross-layer cache (``--clc``) is a change of the token-reduction backbone's forward, not of this
head; it is not implemented (see ``aggzoo.zoo.clca``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aggzoo.models.features import Features
from aggzoo.models.heads.base import Head

__all__ = ["CLCA"]


class CLCA(Head):
    """Cross-layer aggregation of the CLS of the last ``num_layers`` ViT blocks.

    Args:
        in_channels: ``D``, the token width (768 for ViT-B).
        num_layers: ``L``, how many of the backbone's levels (its last ``L``) are aggregated; the
            backbone must return at least that many levels with their CLS (``Features.cls_levels``).
        kernels_per_layer: ``k``: the depthwise convolution makes ``k`` outputs per channel (the
            authors' ``--ifa_dws_conv_groups``, default 2); ``0`` selects the IFA head instead.
        out_dim: width of the retrieval projection that replaces the classifier; default ``D``.
        project: ``False``: no projection, the descriptor is the ``kD`` features (``k = 0``: ``D``).

    Shapes: ``Features(cls_levels=([B, D] x >= L)) -> [B, out_dim]``.
    """

    needs_cls = True
    #: the default ``num_layers``; an instance declares its own
    min_levels = 4

    def __init__(self, in_channels: int, *, num_layers: int = 4, kernels_per_layer: int = 2,
                 out_dim: int | None = None, project: bool = True) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"CLCA num_layers must be >= 1, got {num_layers}")
        if kernels_per_layer < 0:
            raise ValueError(f"CLCA kernels_per_layer must be >= 0 (0: the IFA head), got {kernels_per_layer}")
        d, k = in_channels, kernels_per_layer
        width = k * d if k else d  # the features before the projection
        out_dim = d if out_dim is None else out_dim
        self.in_channels = in_channels
        self.num_layers = num_layers
        self.min_levels = num_layers  # type: ignore[misc]  # per instance: the levels it aggregates
        self.kernels_per_layer = k
        self.out_dim = out_dim if project else width
        if k:
            self.aggregate = nn.Sequential(
                nn.BatchNorm1d(d),
                nn.Conv1d(d, k * d, num_layers, num_layers, groups=d),
                nn.BatchNorm1d(k * d),
                nn.GELU(),
            )
            # a 1-wide Conv1d, as the classifier it replaces: [B, kD, 1] -> [B, out_dim, 1]
            self.proj = nn.Conv1d(k * d, out_dim, 1) if project else None
        else:
            self.aggregate = nn.Sequential(nn.Linear(num_layers, 1), nn.Flatten(1), nn.ReLU(), nn.LayerNorm(d))
            self.proj = nn.Linear(d, out_dim) if project else None

    def forward(self, features: Features) -> Tensor:
        levels = features.cls_levels
        if levels is None or len(levels) < self.num_layers:
            got = "no per-level CLS" if levels is None else f"{len(levels)} levels"
            raise ValueError(f"CLCA aggregates the CLS of the last {self.num_layers} ViT blocks; the backbone gave {got} "
                             f"(a ViT TimmBackbone with {self.num_layers} out_indices gives them)")
        x = torch.stack(levels[-self.num_layers:], dim=-1)  # [B, D, L], shallow -> deep as the authors' list
        z = self.aggregate(x)  # k > 0: [B, kD, 1]; k = 0: [B, D]
        if self.proj is not None:
            z = self.proj(z)
        return F.normalize(z.flatten(1), dim=-1)
