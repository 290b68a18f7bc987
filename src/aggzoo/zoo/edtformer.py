"""EDTformer on DINOv2 ViT-B/14 (final-normed tokens).

No official weights are registered: the released ``EDTformer.pth`` (Tong-Jin01/EDTformer) also
holds the paper's LoPA adapters (``backbone.adapters.{i}.D_fc{1,2}``, a parallel low-rank stream
``y <- A_i(y + block_i(x))`` whose output replaces the blocks' output), and aggzoo has no backbone
with those adapters yet, so the file cannot be loaded faithfully.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from aggzoo.registry import register_model
from aggzoo.zoo._specs import DINOV2_VITB14, head, vpr

__all__ = ["edtformer_dinov2_vitb14"]


@register_model
def edtformer_dinov2_vitb14(**kwargs: Any) -> nn.Module:
    """EDTformer (Q = 64 queries, 2 simplified decoder blocks, d = 256, R = 16) on DINOv2 ViT-B/14: 4096-D."""
    spec = head("edtformer.EDTformer", num_queries=64, num_layers=2, num_heads=16, out_channels=256, out_rows=16,
                dropout=0.1)
    return vpr(DINOV2_VITB14, spec, **kwargs)
