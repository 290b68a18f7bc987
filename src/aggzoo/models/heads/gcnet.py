"""GCNet global-context block as a VPR head: GC block on the last map, then GeM.

Y. Cao, J. Xu, S. Lin, F. Wei, H. Hu, "GCNet: Non-local Networks Meet Squeeze-Excitation Networks
and Beyond", ICCVW 2019, arXiv:1904.11492. Original code: xvjiarui/GCNet
``mmdet/ops/*/context_block.py`` (no licence file found); re-implemented from the paper.

GCNet is not a pooling method: the paper inserts its block into the backbone (after residual
blocks of stages c3-c5, ratio 1/16, attention pooling, channel-add fusion). The faithful VPR use is
therefore "one more GC block at the end of the backbone, then the zoo's default pooling":
``x [B, C, H, W] -> x + W2 ReLU(LN(W1 sum_j softmax_j(W_k x) x_j)) -> GeM -> L2 -> [B, C]``.
The block's last convolution is zero-initialised, so the head starts as exactly the GeM head and
learns only what global context adds to it. Under :func:`aggzoo.models.tlc.convert_tlc` the
block's attention pooling becomes local; GeM, the descriptor pooling, never does.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from aggzoo.layers.attention import GlobalContextBlock
from aggzoo.layers.pooling import GEM_P_LR_MULTIPLIER, GeMPool
from aggzoo.models.features import Features
from aggzoo.models.heads.base import Head

__all__ = ["GCNet"]


class GCNet(Head):
    """Global-context block + GeM pooling of the last map.

    Args:
        in_channels: ``C`` of the last map; ``D = C``.
        ratio: bottleneck ratio of the context transform, ``planes = C * ratio`` (paper: 1/16).
        p: GeM exponent init (3; trained at 10x the learning rate, no weight decay, as GeM).

    Shapes: ``Features(maps=(..., [B, C, H, W])) -> [B, C]``.
    """

    def __init__(self, in_channels: int, *, ratio: float = 1 / 16, p: float = 3.0) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.out_dim = in_channels
        self.block = GlobalContextBlock(in_channels, ratio=ratio)
        self.pool = GeMPool(p=p)

    def forward(self, features: Features) -> Tensor:
        return F.normalize(self.pool(self.block(features.last)), dim=-1)

    def no_weight_decay(self) -> set[str]:
        return {"pool.p"}

    def lr_multipliers(self) -> dict[str, float]:
        return {"pool.p": GEM_P_LR_MULTIPLIER}
