"""Backbones of the :mod:`aggzoo.models` layer: any timm model wrapped to return ``Features``
(``timm_backbone``), with ``out_channels`` and ``feature_info`` so no channel count is copied into
YAML; the ViT with inserted aggregation tokens of ImAge, EDTformer's LoPA adapters, and the offline
ImageNet weights of EfficientNet-Lite0.
"""

from aggzoo.models.backbones.timm_backbone import TimmBackbone

__all__ = ["TimmBackbone"]
