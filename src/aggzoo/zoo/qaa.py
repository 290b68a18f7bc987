"""QAA: query-based adaptive aggregation on DINOv2 ViT-B/14.

J. Xiao et al., "Query-Based Adaptive Aggregation for Multi-Dataset Joint Training Toward Universal
Visual Place Recognition", arXiv:2507.03831. Original code: xjh19972/QAA; the port read for
structure, defaults and state_dict names is gmberton/VPR-methods-evaluation ``vpr_models/qaa.py`` (MIT).
No converter yet for the released weights (Hugging Face ``xjh19971/QAA-*``).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from aggzoo.hub.registry import register_model
from aggzoo.models.heads.qaa import QAA
from aggzoo.zoo._backbones import DINOV2_VITB14, head, vpr

__all__ = ["qaa_dinov2_vitb14"]


@register_model
def qaa_dinov2_vitb14(**kwargs: Any) -> nn.Module:
    """QAA (Xiao et al., arXiv:2507.03831) on DINOv2 ViT-B/14: 64 x 128 = 8192-D."""
    return vpr(DINOV2_VITB14, head(QAA), **kwargs)
