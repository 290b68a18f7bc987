"""Backbones: timm models wrapped to return ``Features``."""

from aggzoo.models.backbones.timm_backbone import TimmBackbone

__all__ = ["TimmBackbone"]
