"""Binarisation with a straight-through gradient (deep hashing).

``sign_ste(z)`` is ``+1`` where ``z >= 0`` and ``-1`` elsewhere (zero maps to ``+1``, as SelaVPR++'s
``STE_binary``, Lu-Feng/SelaVPRplusplus ``model/network.py``, MIT), and passes the incoming gradient
through unchanged in backward (the straight-through estimator, Bengio et al., arXiv:1308.3432), so that a
loss on the codes trains what produced ``z``. The forward value is exactly ``+-1`` (not ``z + (b - z).detach()``,
whose sum can round away from ``+-1``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["sign_ste"]


class _SignSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, z: Tensor) -> Tensor:
        return torch.where(z >= 0, 1.0, -1.0).to(z.dtype)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        return grad


def sign_ste(z: Tensor) -> Tensor:
    """``z -> where(z >= 0, +1, -1)`` (same shape and dtype), gradient passed straight through."""
    return _SignSTE.apply(z)
