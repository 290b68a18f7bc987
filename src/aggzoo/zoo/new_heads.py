"""Heads without a VPR release to convert, at the configurations of their papers or, where no VPR
paper exists, on the project's EfficientNet-Lite0 backbone (trainable offline): QAA and A^2GC on
DINOv2; GSP, GCNet, class attention and the multi-level AFA / IDA heads on EfficientNet-Lite0."""

from __future__ import annotations

from typing import Any

from torch import nn

from aggzoo.registry import register_model
from aggzoo.zoo._specs import DINOV2_VITB14, EFFICIENTNET_LITE0, EFFICIENTNET_LITE0_MULTILEVEL, head, vpr

__all__ = [
    "a2gc_dinov2_vitb14",
    "afa_efficientnet_lite0",
    "classattn_efficientnet_lite0",
    "gcnet_efficientnet_lite0",
    "gsp_efficientnet_lite0",
    "ida_efficientnet_lite0",
    "qaa_dinov2_vitb14",
]

_MULTILEVEL = dict(dim=None, attn_dim=64, reduction=16, fuse_level=-1, p=3.0, proj_dim=None)


@register_model
def qaa_dinov2_vitb14(**kwargs: Any) -> nn.Module:
    """QAA (Xiao et al., arXiv:2507.03831) on DINOv2 ViT-B/14: 64 x 128 = 8192-D."""
    spec = head("qaa.QAA", num_clusters=64, cluster_dim=128, num_queries=256, feature_heads=16, score_heads=16)
    return vpr(DINOV2_VITB14, spec, **kwargs)


@register_model
def a2gc_dinov2_vitb14(**kwargs: Any) -> nn.Module:
    """A^2GC-VPR (SALAD scores + geometric compatibility) on DINOv2 ViT-B/14: 8448-D."""
    spec = head("a2gc.A2GC", num_clusters=64, cluster_dim=128, token_dim=256, dropout=0.3, num_iters=3,
                geo_dim=16, geo_lambda=0.15)
    return vpr(DINOV2_VITB14, spec, **kwargs)


@register_model
def gsp_efficientnet_lite0(**kwargs: Any) -> nn.Module:
    """Generalized sum pooling (Gurbuz et al., ICCV 2023) on EfficientNet-Lite0: 512-D."""
    spec = head("gsp.GSP", embedding_dim=512, num_prototypes=64, transport_ratio=0.3, entropy_weight=5.0, num_iters=100)
    return vpr(EFFICIENTNET_LITE0, spec, **kwargs)


@register_model
def gcnet_efficientnet_lite0(**kwargs: Any) -> nn.Module:
    """GCNet global-context block + GeM on EfficientNet-Lite0: 112-D."""
    return vpr(EFFICIENTNET_LITE0, head("gcnet.GCNet", ratio=0.0625, p=3.0), **kwargs)


@register_model
def classattn_efficientnet_lite0(**kwargs: Any) -> nn.Module:
    """PatchConvNet class-attention pooling on EfficientNet-Lite0: 112-D."""
    spec = head("classattn.ClassAttention", num_heads=1, mlp_ratio=3.0, init_scale=1e-6, proj_dim=None)
    return vpr(EFFICIENTNET_LITE0, spec, **kwargs)


@register_model
def afa_efficientnet_lite0(**kwargs: Any) -> nn.Module:
    """Multi-level AFA fusion of EfficientNet-Lite0 blocks 1/2/4, then GeM: 112-D."""
    return vpr(EFFICIENTNET_LITE0_MULTILEVEL, head("multilevel.MultiLevel", attention=True, **_MULTILEVEL), **kwargs)


@register_model
def ida_efficientnet_lite0(**kwargs: Any) -> nn.Module:
    """Multi-level IDA fusion (AFA without attention) of EfficientNet-Lite0 blocks 1/2/4: 112-D."""
    return vpr(EFFICIENTNET_LITE0_MULTILEVEL, head("multilevel.MultiLevel", attention=False, **_MULTILEVEL), **kwargs)
