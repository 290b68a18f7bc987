"""Backbone and head specs shared by the entry points, and the helper that builds one.

A spec is ``{"_target_": <class under aggzoo.models>, <constructor keyword arguments>}`` -- the same
shape as a Hydra ``conf/backbone`` / ``conf/head`` file -- so a registered model and a trained
pipeline run describe their architecture the same way (and ``save_pretrained`` stores it as is).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from aggzoo.registry import build_model

__all__ = [
    "DINOV2_VITB14",
    "DINOV2_VITB14_BLOCKS",
    "DINOV2_VITB14_LOPA",
    "DINOV2_VITB14_REG4_TOKENS",
    "EFFICIENTNET_LITE0",
    "EFFICIENTNET_LITE0_MULTILEVEL",
    "RESNET50_LAYER3",
    "RESNET50_LAYER4",
    "RESNET101_LAYER4",
    "backbone",
    "head",
    "vpr",
]

_TIMM_BACKBONE = "aggzoo.models.backbones.timm_backbone.TimmBackbone"
_TOKEN_VIT = "aggzoo.models.backbones.aggregation_tokens.AggregationTokenViT"
_LOPA_VIT = "aggzoo.models.backbones.lopa.LoPAViT"

#: DINOv2 models are built for 322 x 322 inputs (23 x 23 patches), the evaluation size of SALAD,
#: BoQ, ImAge and EDTformer; official checkpoints' 37 x 37 position embeddings are resampled to it
#: the way DINOv2 does (aggzoo.convert.backbones). Other sizes work (dynamic_img_size).
DINOV2_EVAL_SIZE = 322


def backbone(model_name: str, *, target: str = _TIMM_BACKBONE, **kwargs: Any) -> dict[str, Any]:
    return {"_target_": target, "model_name": model_name, **kwargs}


def head(path: str, **kwargs: Any) -> dict[str, Any]:
    """``head("gem.GeM", p=3.0)`` -> spec of ``aggzoo.models.heads.gem.GeM``."""
    return {"_target_": f"aggzoo.models.heads.{path}", **kwargs}


# ImageNet EfficientNet-Lite0 (offline weights) cut at stride 16 (blocks.4, 112 channels): the
# project's default backbone, as conf/backbone/tf_efficientnet_lite0.yaml.
EFFICIENTNET_LITE0 = backbone("tf_efficientnet_lite0", out_indices=[-2], frozen_stages=2)
# The same, returning blocks.1/2/4 (24/40/112 channels) for multi-level heads.
EFFICIENTNET_LITE0_MULTILEVEL = backbone("tf_efficientnet_lite0", out_indices=[1, 2, 3], frozen_stages=2)
# ResNets cut after layer3 (1024 channels, MixVPR/BoQ) or layer4 (2048, ConvAP/CosPlace/NetVLAD
# conv5); stem, layer1 and layer2 frozen as in the upstream recipes.
RESNET50_LAYER3 = backbone("resnet50", out_indices=[3], frozen_stages=3)
RESNET50_LAYER4 = backbone("resnet50", out_indices=[4], frozen_stages=3)
RESNET101_LAYER4 = backbone("resnet101", out_indices=[4], frozen_stages=3)
# DINOv2 ViT-B/14, final norm applied, last 4 blocks trainable (SALAD, MegaLoc, EDTformer).
DINOV2_VITB14 = backbone(
    "vit_base_patch14_dinov2", img_size=DINOV2_EVAL_SIZE, dynamic_img_size=True, frozen_stages=8, final_norm=True
)
# DINOv2 ViT-B/14 without the final norm, last 2 blocks trainable (BoQ reads the raw block output).
DINOV2_VITB14_BLOCKS = dict(DINOV2_VITB14, frozen_stages=10, final_norm=False)
# DINOv2 ViT-B/14, frozen, with EDTformer's parallel low-rank adapters (r = 4) beside its blocks.
DINOV2_VITB14_LOPA = backbone(
    "vit_base_patch14_dinov2", target=_LOPA_VIT, adapter_dim=4, adapter_scale=0.5, frozen_stages=None,
    img_size=DINOV2_EVAL_SIZE, dynamic_img_size=True,
)
# DINOv2 ViT-B/14 with 4 registers and 8 aggregation tokens before block 8 (ImAge).
DINOV2_VITB14_REG4_TOKENS = backbone(
    "vit_base_patch14_reg4_dinov2", target=_TOKEN_VIT, num_tokens=8, insert_before_block=8,
    img_size=DINOV2_EVAL_SIZE, dynamic_img_size=True,
)


def vpr(
    backbone_spec: Mapping[str, Any],
    head_spec: Mapping[str, Any],
    *,
    pretrained_backbone: bool = False,
    backbone_kwargs: Mapping[str, Any] | None = None,
    **head_kwargs: Any,
) -> nn.Module:
    """Build ``VPRModel(backbone, head)`` from two specs.

    Args:
        pretrained_backbone: load the backbone's own pretrained weights (ImageNet / DINOv2).
        backbone_kwargs: overrides of the backbone spec (``img_size``, ``frozen_stages``, ...).
        **head_kwargs: overrides of the head's keyword arguments.
    """
    spec = {
        "backbone": {**backbone_spec, **(backbone_kwargs or {}), "pretrained": bool(pretrained_backbone)},
        "head": {**head_spec, **head_kwargs},
    }
    return build_model(spec)
