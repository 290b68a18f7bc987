"""Global pooling operators shared by several heads."""

from __future__ import annotations

import struct
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["GEM_P_LR_MULTIPLIER", "gem", "GeMPool", "regional_gem"]

#: Upstream (filipradenovic/cnnimageretrieval-pytorch) trains GeM's ``p`` at 10x the base learning
#: rate and without weight decay; heads that hold a learnable GeM declare it with this factor.
GEM_P_LR_MULTIPLIER = 10.0


def gem(x: Tensor, p: Tensor | float, eps: float = 1e-6) -> Tensor:
    """Generalized-mean pooling over the spatial axes.

    ``x: [B, C, H, W] -> [B, C]``, ``(mean_i clamp(x_i, eps)^p)^(1/p)``. Computed in fp32 because
    ``x^p`` overflows fp16 for large activations.
    """
    dtype = x.dtype
    x = x.float().clamp(min=eps)
    p = p.float() if isinstance(p, Tensor) else float(p)
    return x.pow(p).mean(dim=(-2, -1)).pow(1.0 / p).to(dtype)


def regional_gem(x: Tensor, p: float = 2.5, size: int = 5) -> Tensor:
    """SuperGlobal's regional GeM: every position averaged with the power mean of its window.

    ``x: [B, C, H, W] -> [B, C, H, W]``,
    ``y = x / 2 + (mean_{j in window(i)} x_j^p)^(1/p) / 2`` over the ``size x size`` window centred on
    each position, the map reflection-padded by ``size // 2`` (ShihaoShao-GH/SuperGlobal ``rgem``:
    p = 2.5, size 5, written there as an LP-pool of ``x / (size^2)^(1/p)``, which is this power
    mean). The power mean reads ``clamp(x, 0)``: identical on the non-negative maps of the authors'
    ResNet, and defined (instead of NaN) where a backbone gives negative activations. Needs
    ``H, W > size // 2`` (reflection padding). Computed in fp32, as :func:`gem`.
    """
    pad = size // 2
    if min(x.shape[-2:]) <= pad:
        raise ValueError(f"regional GeM over {size}x{size} windows needs maps of at least {pad + 1}x{pad + 1} "
                         f"positions, got {tuple(x.shape[-2:])}: use a larger input or a smaller regional_size")
    dtype = x.dtype
    x = x.float()
    window = F.avg_pool2d(F.pad(x.clamp(min=0).pow(p), (pad, pad, pad, pad), mode="reflect"), size, stride=1)
    return (0.5 * x + 0.5 * window.pow(1.0 / p)).to(dtype)


class GeMPool(nn.Module):
    """GeM pooling with a learnable exponent ``p`` (Radenovic et al., init 3) or a fixed one.

    ``x: [B, C, H, W] -> [B, C]``. ``p`` is a parameter either way, so checkpoints hold ``pool.p``
    whether it was trained or not. A fixed exponent is applied as a Python float: ``pow`` with a
    tensor exponent saves its output for the exponent's gradient, which costs one more
    ``[B, C, H, W]`` activation in backward (40 % more peak memory for GeM+) even when that
    gradient is never wanted. The float is re-read from ``p`` whenever a state_dict is loaded.
    """

    def __init__(self, *, p: float = 3.0, eps: float = 1e-6, learn_p: bool = True) -> None:
        super().__init__()
        self.p = nn.Parameter(torch.full((1,), float(p)), requires_grad=learn_p)
        self.eps = eps
        # the float32 value the parameter holds (computed without reading it, which a meta-device build
        # cannot), so a model and its reloaded copy agree to the bit
        self._fixed_p = None if learn_p else struct.unpack("f", struct.pack("f", float(p)))[0]

    def forward(self, x: Tensor) -> Tensor:
        return gem(x, self.p if self._fixed_p is None else self._fixed_p, self.eps)

    def _load_from_state_dict(self, state_dict: dict[str, Tensor], prefix: str, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        if self._fixed_p is not None:
            self._fixed_p = float(self.p.detach()[0])

