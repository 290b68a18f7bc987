"""Rotary position embeddings (RoPE) of timm's ``Eva`` ViTs (DINOv3): tokens without a position.

timm's Eva attention rotates queries and keys of the tokens after its ``num_prefix_tokens`` with a
``[n, 2k]`` table ``cat(sin, cos)`` (``timm.layers.apply_rot_embed_cat``) and leaves the prefix
(class and storage tokens) unrotated. A backbone that prepends tokens of its own (ImAge's
aggregation tokens) makes the rotated part ``T`` rows longer; giving those rows ``sin = 0, cos = 1``
rotates them by zero, which is what Eva does to its prefix tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["unrotated_prefix"]


def unrotated_prefix(rope: Tensor, count: int) -> Tensor:
    """``rope: [..., n, 2k]`` (``cat(sin, cos)`` on the last axis) -> ``[..., count + n, 2k]`` whose first
    ``count`` rows are the identity rotation (``sin = 0``, ``cos = 1``)."""
    half = rope.shape[-1] // 2
    shape = (*rope.shape[:-2], count, half)
    identity = torch.cat([rope.new_zeros(shape), rope.new_ones(shape)], dim=-1)
    return torch.cat([identity, rope], dim=-2)
