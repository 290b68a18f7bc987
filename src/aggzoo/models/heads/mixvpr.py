"""MixVPR: feature mixing over the spatial axis of a fixed-size map.

A. Ali-bey, B. Chaib-draa, P. Giguere, "MixVPR: Feature Mixing for Visual Place Recognition",
WACV 2023, arXiv:2303.02190. Original code: amaralibey/MixVPR ``models/aggregators/mixvpr.py``
(the repository has no licence file, so all rights are reserved: this is a re-implementation
from the paper's equations; no code was taken from it).

``x: [B, C, H, W] -> X = flatten -> [B, C, n]`` with ``n = H*W``; ``L`` residual Feature-Mixers act
on the ``n`` axis of every channel row independently:
``X <- X + W_2 ReLU(W_1 LN_n(X))`` (``W_1: n -> r*n``, ``W_2: r*n -> n``); then a depth-wise
projection ``Linear(C -> d)`` over channels and a row-wise projection ``Linear(n -> R)`` over the
spatial axis give ``[B, d, R]``, flattened channel-major and L2-normalised -> ``[B, d*R]``.

Because ``n`` is baked into the mixers, the head works at one map size only: the paper's ResNet-50
cut after layer3 (stride 16) sees 20 x 20 maps at 320 x 320. A different size raises an error
naming the size it needs. State-dict names mirror the original (``mix.{i}.mix.{0,1,3}``,
``channel_proj``, ``row_proj``).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from aggzoo.models.features import Features
from aggzoo.models.heads.base import Head

__all__ = ["MixVPR", "FeatureMixer"]

#: Output strides of the usual backbones, used to translate a map size into an image size.
_COMMON_STRIDES = (
    (16, "stride-16 backbone such as ResNet-50 cut after layer3"),
    (14, "stride-14 ViT such as DINOv2"),
)


class FeatureMixer(nn.Module):
    """One residual Feature-Mixer: ``x + Linear(r*n -> n)(ReLU(Linear(n -> r*n)(LayerNorm_n(x))))``.

    ``x: [B, C, n] -> [B, C, n]``. Linear weights start from a normal of std 0.02 (PyTorch's
    ``trunc_normal_`` with its absolute +-2 bounds, as in the paper's code) and biases at zero, so
    each mixer starts close to the identity.
    """

    def __init__(self, num_positions: int, mlp_ratio: float = 1.0) -> None:
        super().__init__()
        hidden = int(num_positions * mlp_ratio)
        # Sequential indices 0 (norm), 1 (fc), 3 (fc) match the original state-dict keys.
        self.mix = nn.Sequential(
            nn.LayerNorm(num_positions),
            nn.Linear(num_positions, hidden),
            nn.ReLU(),
            nn.Linear(hidden, num_positions),
        )
        for layer in (self.mix[1], self.mix[3]):
            nn.init.trunc_normal_(layer.weight, std=0.02)
            nn.init.zeros_(layer.bias)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.mix(x)


class MixVPR(Head):
    """MixVPR head.

    Args:
        in_channels: ``C`` of the last map (paper: 1024, ResNet-50 layer3).
        in_h: height of the feature map the head is built for (paper: 20).
        in_w: width of the feature map the head is built for (paper: 20).
        out_channels: ``d``, depth-wise projection size (paper: 1024).
        mix_depth: ``L``, number of Feature-Mixers (paper: 4).
        mlp_ratio: ``r``, hidden width of a mixer relative to ``n`` (paper: 1).
        out_rows: ``R``, row-wise projection size (paper: 4).

    Shapes: ``Features(maps=(..., [B, C, in_h, in_w])) -> [B, d * R]``, laid out ``[d, R]`` (channel-major).
    """

    #: the mixers are sized for ``n = in_h * in_w`` positions
    map_size_args = ("in_h", "in_w")

    def __init__(
        self,
        in_channels: int,
        *,
        in_h: int = 20,
        in_w: int = 20,
        out_channels: int = 1024,
        mix_depth: int = 4,
        mlp_ratio: float = 1.0,
        out_rows: int = 4,
    ) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.in_h, self.in_w = in_h, in_w
        self.out_channels = out_channels
        self.out_rows = out_rows
        self.out_dim = out_channels * out_rows
        num_positions = in_h * in_w
        self.mix = nn.Sequential(*(FeatureMixer(num_positions, mlp_ratio) for _ in range(mix_depth)))
        self.channel_proj = nn.Linear(in_channels, out_channels)
        self.row_proj = nn.Linear(num_positions, out_rows)

    def _check_input(self, x: Tensor) -> None:
        h, w = x.shape[-2:]
        if (h, w) != (self.in_h, self.in_w):
            sizes = "; ".join(f"{self.in_h * s}x{self.in_w * s} images on a {name}" for s, name in _COMMON_STRIDES)
            raise ValueError(
                f"MixVPR was built for {self.in_h}x{self.in_w} feature maps ({sizes}); got {h}x{w}. "
                f"Resize the images to in_h*stride x in_w*stride, or build the head for this size: head.in_h={h} "
                f"head.in_w={w} on the train.py / eval.py command line (MixVPR(..., in_h={h}, in_w={w}) in Python)."
            )
        if x.shape[1] != self.in_channels:
            raise ValueError(f"MixVPR was built for {self.in_channels}-channel maps; got {x.shape[1]} channels")

    def forward(self, features: Features) -> Tensor:
        x = features.last
        self._check_input(x)
        x = self.mix(x.flatten(2))  # [B, C, n], mixing along n
        return F.normalize(self._project(x).flatten(1), dim=1)

    def _project(self, x: Tensor) -> Tensor:
        """``[B, C, n] -> [B, d, R]``: the paper's channel projection, then its row projection,
        ``W_c X W_r^T + b_c (W_r 1_n)^T + 1_d b_r^T``.

        The two act on different axes, so the row projection (``n -> R``) runs first: the channel
        projection then sees ``R`` columns instead of ``n`` (at the paper size 4 instead of 400, a
        hundredth of its multiply-adds), and the channel bias enters through the row sums of ``W_r``.
        Same values and gradients as the paper's order.
        """
        rows = F.linear(x, self.row_proj.weight)  # [B, C, R]
        out = F.linear(rows.transpose(1, 2), self.channel_proj.weight).transpose(1, 2)  # [B, d, R]
        bias = self.channel_proj.bias[:, None] * self.row_proj.weight.sum(dim=1) + self.row_proj.bias  # [d, R]
        return out + bias
