"""GeM: generalized-mean pooling.

F. Radenovic, G. Tolias, O. Chum, "Fine-tuning CNN Image Retrieval with No Human Annotation",
TPAMI 2018, arXiv:1711.02512. Original code: filipradenovic/cnnimageretrieval-pytorch (MIT).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from aggzoo.hub.registry import register_model
from aggzoo.models.heads.gem import GeM
from aggzoo.zoo._backbones import EFFICIENTNET_LITE0, RESNET50_LAYER4, head, vpr

__all__ = ["gem_efficientnet_lite0", "gem_resnet50"]


@register_model
def gem_efficientnet_lite0(**kwargs: Any) -> nn.Module:
    """GeM (p = 3, learnable) on EfficientNet-Lite0 (stride 16): 112-D."""
    return vpr(EFFICIENTNET_LITE0, head(GeM), **kwargs)


@register_model
def gem_resnet50(**kwargs: Any) -> nn.Module:
    """GeM on ResNet-50 layer4 (Radenovic et al.): 2048-D."""
    return vpr(RESNET50_LAYER4, head(GeM), **kwargs)
