"""MaxPool-CLS: the MaxPoolBERT aggregation ported to ViT retrieval.

M. Behrendt, S. S. Wagner, S. Harmeling, "MaxPoolBERT: Enhancing BERT Classification via Layer- and
Token-Wise Aggregation", arXiv:2505.15696 (no code was found to read; built from the paper's
description). MaxPoolBERT refines BERT's ``[CLS]`` in three ways: (i) an element-wise max of the
CLS over the last ``L`` layers, (ii) one extra multi-head attention layer in which the CLS attends over
the final layer's tokens, (iii) both: an element-wise max over the last ``L`` layers of the *whole*
sequence, then the attention layer, reading its CLS position. One formula covers all three here:

    S = max_{l in last L} [cls_l; patches_l]   [B, 1 + n, C]   (element-wise over layers)
    d = L2( MHA(S, S, S)[:, 0] )  if attend    (L = 1: variant ii; L > 1: iii)
    d = L2( S[:, 0] )             otherwise    (variant i: the max-pooled CLS)

Used on a ViT with ``out_indices`` covering the last ``L`` blocks (the maps and the CLS of each;
the ``maxpool_cls_dinov2_vitb14`` entry sets them). ``attend=False`` has no parameters: a
training-free descriptor of any ViT.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aggzoo.models.features import Features
from aggzoo.models.heads.base import Head

__all__ = ["MaxPoolCLS"]


class MaxPoolCLS(Head):
    """Max-pooled CLS over the last ``num_layers`` ViT blocks, optionally refined by one attention layer.

    Args:
        in_channels: ``C``, the token width (768 for ViT-B).
        num_layers: ``L``, how many of the backbone's levels (its last ``L``) are max-pooled; the
            backbone must return at least that many levels with their CLS (``Features.cls_levels``).
        attend: add the attention layer over the pooled sequence (MaxPoolBERT's full model).
        num_heads: heads of that layer; default ``C // 64``, the ViTs' head width of 64 (ViT-S 6,
            ViT-B 12, ViT-L 16: as their own blocks).

    Shapes: ``Features(maps=([B, C, H, W] x >= L), cls_levels=([B, C] x >= L)) -> [B, C]``.
    """

    needs_cls = True
    #: the default ``num_layers``; an instance declares its own
    min_levels = 3

    def __init__(self, in_channels: int, *, num_layers: int = 3, attend: bool = True, num_heads: int | None = None) -> None:
        super().__init__()
        num_heads = max(1, in_channels // 64) if num_heads is None else num_heads
        if num_layers < 1:
            raise ValueError(f"MaxPoolCLS num_layers must be >= 1, got {num_layers}")
        if attend and in_channels % num_heads:
            raise ValueError(f"MaxPoolCLS: in_channels {in_channels} must be divisible by num_heads {num_heads}")
        self.in_channels = in_channels
        self.out_dim = in_channels
        self.num_layers = num_layers
        self.min_levels = num_layers  # type: ignore[misc]  # per instance: the levels it pools
        self.attend = attend
        self.attention = nn.MultiheadAttention(in_channels, num_heads, batch_first=True) if attend else None

    def _last_levels(self, features: Features) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
        levels = features.cls_levels
        if levels is None or len(levels) < self.num_layers:
            got = "no per-level CLS" if levels is None else f"{len(levels)} levels"
            raise ValueError(f"MaxPoolCLS pools the CLS of the last {self.num_layers} ViT blocks; the backbone gave {got} "
                             f"(a ViT TimmBackbone with {self.num_layers} out_indices gives them)")
        return features.maps[-self.num_layers:], levels[-self.num_layers:]

    def forward(self, features: Features) -> Tensor:
        maps, cls_levels = self._last_levels(features)
        if self.attention is None:
            return F.normalize(torch.stack(cls_levels).amax(dim=0), dim=-1)
        sequences = [torch.cat([cls[:, None], fmap.flatten(2).transpose(1, 2)], dim=1) for fmap, cls in zip(maps, cls_levels)]
        pooled = torch.stack(sequences).amax(dim=0)  # [B, 1 + n, C]
        attended = self.attention(pooled[:, :1], pooled, pooled, need_weights=False)[0][:, 0]
        return F.normalize(attended, dim=-1)
