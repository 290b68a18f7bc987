"""GeM+: SuperGlobal's GeM with a fixed exponent.

S. Shao, K. Chen, A. Karpur, Q. Cui, A. Araujo, B. Cao, "Global Features are All You Need for
Image Retrieval and Reranking", ICCV 2023, arXiv:2308.06954. Original code:
ShihaoShao-GH/SuperGlobal (MIT).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from aggzoo.hub.registry import register_model
from aggzoo.models.heads.gemplus import GeMPlus
from aggzoo.zoo._backbones import EFFICIENTNET_LITE0, head, vpr

__all__ = ["gemplus_efficientnet_lite0"]


@register_model
def gemplus_efficientnet_lite0(**kwargs: Any) -> nn.Module:
    """SuperGlobal's GeM+ (regional GeM p 2.5 over 5x5, then GeM p fixed at 4.6) on EfficientNet-Lite0 (stride 16): 112-D."""
    return vpr(EFFICIENTNET_LITE0, head(GeMPlus), **kwargs)
