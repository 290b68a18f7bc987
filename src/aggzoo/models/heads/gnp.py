"""GNP: generalized norm pooling, a learned L^p norm over the positions of each channel.

C. Gulcehre, K. Cho, R. Pascanu, Y. Bengio, "Learned-Norm Pooling for Deep Feedforward and
Recurrent Neural Networks", ECML-PKDD 2014, arXiv:1311.1780 (the L^p unit). Re-implemented from
the paper; no code taken from anywhere.

The paper's L^p unit pools a group of N inputs by their normalised L^p norm with an order learned
per unit, ``p = 1 + log(1 + exp(rho))`` so that ``p >= 1`` stays a norm. As a global descriptor
pooling, each channel ``c`` of ``x: [B, C, H, W]`` is one unit over its ``N = H*W`` positions:

    y_c = ( (1/N) sum_i |x_ci|^(p_c) )^(1/p_c)        (normalized=True; sum pooling drops the 1/N)

so ``p_c = 1`` is average pooling of ``|x|`` (sum pooling without the 1/N), ``p_c = 2`` root-mean-
square pooling and ``p_c -> inf`` max pooling; GeM is the special case of one shared ``p`` on
clamped activations. The descriptor is ``L2(y) [B, C]``.

Why ``max |x|`` is factored out before the power: ``(mean |x|^p)^(1/p) = m (mean (|x|/m)^p)^(1/p)``
with ``m = max_i |x_ci|`` keeps every power in [0, 1], so large orders neither overflow (fp16,
bf16) nor underflow to a zero norm.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aggzoo.models.features import Features
from aggzoo.models.heads.base import Head

__all__ = ["GNP", "learned_norm_pool"]


def learned_norm_pool(x: Tensor, p: Tensor, *, normalized: bool = True, eps: float = 1e-12) -> Tensor:
    """``x: [B, C, H, W]``, ``p: [C]`` (each >= 1) -> ``[B, C]``, the L^p norm of each channel over
    its positions (divided by ``N^(1/p)`` when ``normalized``). Computed in fp32."""
    dtype = x.dtype
    magnitude = x.float().abs().flatten(2)                      # [B, C, N]
    peak = magnitude.amax(dim=-1, keepdim=True).clamp_min(eps)  # [B, C, 1]
    order = p.float().view(1, -1, 1)
    powered = (magnitude / peak).pow(order)
    pooled = powered.mean(dim=-1) if normalized else powered.sum(dim=-1)
    return (peak.squeeze(-1) * pooled.pow(1.0 / order.squeeze(-1))).to(dtype)


class GNP(Head):
    """Generalized norm pooling of the last map (one learned order per channel), then L2.

    Args:
        in_channels: ``C`` of the last map; the descriptor has ``D = C``.
        p: initial order of every channel (> 1; paper: learned from any start, here 3 as GeM).
        learn_p: train the orders (paper) or keep them fixed.
        normalized: the paper's normalised norm (mean over positions); ``False`` sums them.

    Shapes: ``Features(maps=(..., [B, C, H, W])) -> [B, C]``.
    """

    def __init__(self, in_channels: int, *, p: float = 3.0, learn_p: bool = True, normalized: bool = True) -> None:
        super().__init__()
        if not p > 1.0:
            raise ValueError(f"GNP's order is 1 + softplus(rho) > 1; the initial p must be > 1, got {p}")
        self.in_channels = in_channels
        self.out_dim = in_channels
        self.normalized = normalized
        # rho = softplus^-1(p - 1), so that p = 1 + softplus(rho) starts at p.
        rho = math.log(math.expm1(p - 1.0))
        self.rho = nn.Parameter(torch.full((in_channels,), rho), requires_grad=learn_p)

    def no_weight_decay(self) -> set[str]:
        # Decay would pull every rho to 0, i.e. every order to 1 + log 2: a prior the paper does not have.
        return {"rho"}

    @property
    def p(self) -> Tensor:
        """The per-channel orders ``[C]``, each > 1."""
        return 1.0 + F.softplus(self.rho)

    def forward(self, features: Features) -> Tensor:
        return F.normalize(learned_norm_pool(features.last, self.p, normalized=self.normalized), dim=-1)
