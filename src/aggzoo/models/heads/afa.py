"""AFA multi-level head: iterative deep layer aggregation of 2-4 backbone levels with AFA's attentive
fusion, then global pooling (:class:`AFA`; its attention-free ablation is :class:`~aggzoo.models.heads.ida.IDA`).

- IDA: F. Yu, D. Wang, E. Shelhamer, T. Darrell, "Deep Layer Aggregation", CVPR 2018,
  arXiv:1707.06484. Original code: ucbdrive/dla ``dla.py``, ``dla_up.py`` (BSD-3-Clause).
- AFA: Y.-H. Yang, T. E. Huang, M. Sun, S. Rota Bulo, P. Kontschieder, F. Yu, "Dense Prediction
  with Attentive Feature Aggregation", WACV 2023, arXiv:2111.00770. Original code: SysCV/dla-afa
  ``afa/model/necks/afa_dla_up.py`` (no licence file found). Re-implemented from the papers.

No VPR method aggregates more than the last stage; this head is new ground, built from the two
papers' parts. With levels ``f_1..f_L`` (fine -> coarse, ``f_l: [B, C_l, H_l, W_l]``):

1. align: every level is brought to the resolution of level ``fuse_level`` (default: the coarsest,
   where the backbone is cut) and projected to ``dim`` channels (Conv1x1-BN-ReLU; identity where
   ``C_l = dim``, as upstream). Finer levels are area-averaged *before* the projection, coarser
   ones bilinearly upsampled *after* it, so the projection always runs at the smaller size.
2. IDA, shallow to deep: ``x_1 = f_1``, ``x_{l+1} = s_l (1 - c_l) x_l + (1 - s_l) c_l f_{l+1}`` with
   AFA's spatial attention ``s_l = SA_l(x_l) [B, 1, H, W]`` on the aggregate so far and channel
   attention ``c_l = CA_l(f_{l+1}) [B, dim, 1, 1]`` on the deeper level.
3. multi-level compositing of the IDA states ``x_1..x_L`` (the last, holding every level, on top):
   ``a_i = s_i prod_{j>i} (1 - s_j)`` for a shared spatial attention ``s_i = SA(x_i)`` and the same
   for a shared channel attention, ``y = sum_i a^s_i a^c_i x_i``.
4. ``GeM(y) [B, dim] -> Linear(dim, proj_dim)`` (optional) ``-> L2``.

``attention=False`` (the :class:`~aggzoo.models.heads.ida.IDA` head) gives plain IDA for ablation:
each merge is a DLA root node ``ReLU(BN(Conv1x1([x_l; f_{l+1}])))`` and the descriptor pools ``x_L`` (no compositing).

Why the coarsest resolution: the descriptor is pooled globally right after, the backbone is cut
at that level anyway, and every operator of the fusion costs ``O(H W)``: fusing at stride 8 instead
of 16 costs 4x (upstream fuses at the finest level because it predicts dense maps).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aggzoo.layers.attention import ChannelAttention, SpatialAttention, composite_weights
from aggzoo.layers.pooling import GEM_P_LR_MULTIPLIER, GeMPool
from aggzoo.models.features import Features
from aggzoo.models.heads.base import FeatureLevel, Head

__all__ = ["AFA"]


def _resize(x: Tensor, size: tuple[int, int]) -> Tensor:
    """Area average when shrinking (exact for integer strides, no aliasing), bilinear when growing."""
    if tuple(x.shape[-2:]) == tuple(size):
        return x
    if x.shape[-2] >= size[0] and x.shape[-1] >= size[1]:
        return F.adaptive_avg_pool2d(x, size)
    return F.interpolate(x, size=size, mode="bilinear", align_corners=False)


def _conv_bn_relu(in_channels: int, out_channels: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 1, bias=False), nn.BatchNorm2d(out_channels), nn.ReLU(inplace=True)
    )


class AFA(Head):
    """IDA/AFA fusion of several backbone levels, then GeM -> (Linear) -> L2.

    Args:
        in_channels: channels ``(C_1, ..., C_L)`` of the levels, fine -> coarse (L >= 2); the
            model builder fills them from the backbone's ``out_indices``.
        dim: fused width; default ``C_L``, so the descriptor has the size GeM on the last map would.
        attn_dim: bottleneck width of the spatial attentions' two 3x3 convolutions.
        reduction: channel-attention MLP reduction ``r`` (AFA: 16).
        attention: AFA fusion (True) or plain IDA root nodes (False), for ablation.
        fuse_level: index of the level whose resolution the fusion runs at (-1: coarsest).
        p: GeM exponent init (3).
        proj_dim: if set, a Linear ``dim -> proj_dim`` before the final L2; ``D = proj_dim or dim``.

    Shapes: ``Features(maps=(f_1, ..., f_L)) -> [B, D]``, ``f_l: [B, C_l, H_l, W_l]``, L >= 2.
    """

    #: fuses several levels: the backbone needs several out_indices
    min_levels = 2

    def __init__(
        self,
        in_channels: Sequence[int],
        *,
        dim: int | None = None,
        attn_dim: int = 64,
        reduction: int = 16,
        attention: bool = True,
        fuse_level: int = -1,
        p: float = 3.0,
        proj_dim: int | None = None,
    ) -> None:
        super().__init__()
        if isinstance(in_channels, int) or len(in_channels) < 2:
            raise ValueError(
                f"{type(self).__name__} fuses several backbone levels but got in_channels={in_channels!r}. Build the "
                "backbone with several out_indices, e.g. backbone.out_indices=[2,3,4] (see "
                "conf/backbone/dla34.yaml or tf_efficientnet_lite0_multilevel.yaml)."
            )
        num_levels = len(in_channels)
        if not -num_levels <= fuse_level < num_levels:
            raise ValueError(f"fuse_level must index one of the {num_levels} levels, got {fuse_level}")
        self.in_channels = tuple(int(c) for c in in_channels)
        self.dim = dim = int(dim or self.in_channels[-1])
        self.attention = attention
        self.fuse_level = fuse_level % num_levels
        self.proj = nn.ModuleList(nn.Identity() if c == dim else _conv_bn_relu(c, dim) for c in self.in_channels)
        if attention:
            self.spatial = nn.ModuleList(SpatialAttention(dim, hidden=attn_dim) for _ in range(num_levels - 1))
            self.channel = nn.ModuleList(ChannelAttention(dim, reduction=reduction) for _ in range(num_levels - 1))
            # One spatial and one channel attention shared by every level of the compositing (upstream).
            self.level_spatial = SpatialAttention(dim, hidden=attn_dim)
            self.level_channel = ChannelAttention(dim, reduction=reduction)
        else:
            self.nodes = nn.ModuleList(_conv_bn_relu(2 * dim, dim) for _ in range(num_levels - 1))
        self.pool = GeMPool(p=p)
        self.fc = nn.Linear(dim, proj_dim) if proj_dim else nn.Identity()
        self.out_dim = int(proj_dim or dim)

    @classmethod
    def in_channels_from(cls, feature_info: Sequence[FeatureLevel]) -> tuple[int, ...]:
        return tuple(level["num_chs"] for level in feature_info)

    def align(self, features: Features) -> list[Tensor]:
        """Levels resized to the fusion resolution and projected: ``L x [B, dim, H_f, W_f]``."""
        maps = features.maps
        if len(maps) != len(self.in_channels):
            raise ValueError(
                f"{type(self).__name__} was built for {len(self.in_channels)} levels {self.in_channels} but got "
                f"{len(maps)} maps; the backbone's out_indices must match the head's levels"
            )
        size = tuple(maps[self.fuse_level].shape[-2:])
        aligned = []
        for proj, x in zip(self.proj, maps):
            shrinking = x.shape[-2] * x.shape[-1] > size[0] * size[1]
            aligned.append(proj(_resize(x, size)) if shrinking else _resize(proj(x), size))
        return aligned

    def ida_states(self, levels: Sequence[Tensor]) -> list[Tensor]:
        """The IDA aggregates ``x_1..x_L`` after each merge, shallow to deep."""
        states = [levels[0]]
        if self.attention:
            for spatial, channel, deeper in zip(self.spatial, self.channel, levels[1:]):
                x = states[-1]
                s, c = spatial(x), channel(deeper)
                states.append(s * (1 - c) * x + (1 - s) * c * deeper)
        else:
            for node, deeper in zip(self.nodes, levels[1:]):
                states.append(node(torch.cat((states[-1], deeper), dim=1)))
        return states

    def fusion_weights(self, states: Sequence[Tensor]) -> list[Tensor]:
        """Compositing weights ``a^s_i a^c_i`` of the IDA states (``[B, dim, H, W]`` each)."""
        spatial = composite_weights([self.level_spatial(x) for x in states])
        channel = composite_weights([self.level_channel(x) for x in states])
        return [a_s * a_c for a_s, a_c in zip(spatial, channel)]

    def fuse(self, features: Features) -> Tensor:
        """The fused map ``y: [B, dim, H_f, W_f]`` that the descriptor pools."""
        states = self.ida_states(self.align(features))
        if not self.attention:
            return states[-1]
        return sum(w * x for w, x in zip(self.fusion_weights(states), states))

    def forward(self, features: Features) -> Tensor:
        return F.normalize(self.fc(self.pool(self.fuse(features))), dim=-1)

    def no_weight_decay(self) -> set[str]:
        return {"pool.p"}

    def lr_multipliers(self) -> dict[str, float]:
        return {"pool.p": GEM_P_LR_MULTIPLIER}
