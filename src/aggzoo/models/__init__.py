"""Backbones, heads and the VPR model that joins them (imports only torch and timm)."""

from aggzoo.models.features import Features
from aggzoo.models.vpr_model import VPRModel, build_head

__all__ = ["Features", "VPRModel", "build_head"]
