"""Class-attention pooling (PatchConvNet) as a head, on EfficientNet-Lite0.

H. Touvron, M. Cord, A. El-Nouby, P. Bojanowski, A. Joulin, G. Synnaeve, H. Jegou, "Augmenting
Convolutional networks with attention-based aggregation", arXiv:2112.13692. Original code:
facebookresearch/deit ``patchconvnet_models.py`` (CC BY-NC 4.0 in the version read).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from aggzoo.hub.registry import register_model
from aggzoo.models.heads.classattn import ClassAttention
from aggzoo.zoo._backbones import EFFICIENTNET_LITE0, head, vpr

__all__ = ["classattn_efficientnet_lite0"]


@register_model
def classattn_efficientnet_lite0(**kwargs: Any) -> nn.Module:
    """PatchConvNet class-attention pooling on EfficientNet-Lite0: 112-D."""
    return vpr(EFFICIENTNET_LITE0, head(ClassAttention), **kwargs)
