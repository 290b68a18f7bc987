"""Pooling baselines on the project's backbones: average pooling, GeM, GeM+, NetVLAD on
EfficientNet-Lite0 (trainable offline) and the classic ResNet-50 GeM.

The NetVLAD entry point of the deep-visual-geo-localization-benchmark (with its official weights)
lives in :mod:`aggzoo.zoo.netvlad`.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from aggzoo.registry import register_model
from aggzoo.zoo._specs import EFFICIENTNET_LITE0, RESNET50_LAYER4, head, vpr

__all__ = [
    "avgpool_efficientnet_lite0",
    "gem_efficientnet_lite0",
    "gem_resnet50",
    "gemplus_efficientnet_lite0",
    "netvlad_efficientnet_lite0",
]


@register_model
def avgpool_efficientnet_lite0(**kwargs: Any) -> nn.Module:
    """Global average pooling on EfficientNet-Lite0 (stride 16): 112-D. The baseline."""
    return vpr(EFFICIENTNET_LITE0, head("avgpool.AvgPool"), **kwargs)


@register_model
def gem_efficientnet_lite0(**kwargs: Any) -> nn.Module:
    """GeM (p = 3, learnable) on EfficientNet-Lite0 (stride 16): 112-D."""
    return vpr(EFFICIENTNET_LITE0, head("gem.GeM", p=3.0, eps=1e-6, learn_p=True), **kwargs)


@register_model
def gem_resnet50(**kwargs: Any) -> nn.Module:
    """GeM on ResNet-50 layer4 (Radenovic et al.): 2048-D."""
    return vpr(RESNET50_LAYER4, head("gem.GeM", p=3.0, eps=1e-6, learn_p=True), **kwargs)


@register_model
def gemplus_efficientnet_lite0(**kwargs: Any) -> nn.Module:
    """GeM+ (SuperGlobal, p fixed at 4.6) on EfficientNet-Lite0 (stride 16): 112-D."""
    return vpr(EFFICIENTNET_LITE0, head("gemplus.GeMPlus", p=4.6, eps=1e-8), **kwargs)


@register_model
def netvlad_efficientnet_lite0(**kwargs: Any) -> nn.Module:
    """NetVLAD (K = 64) on EfficientNet-Lite0 (stride 16): 64 x 112 = 7168-D."""
    return vpr(EFFICIENTNET_LITE0, head("netvlad.NetVLAD", num_clusters=64, normalize_input=True), **kwargs)
