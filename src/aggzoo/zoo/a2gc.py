"""A^2GC-VPR: SALAD's scores plus geometric compatibility, asymmetric Sinkhorn, on DINOv2 ViT-B/14.

Z. Li, T. Shang, "A^2GC: Asymmetric Aggregation with Geometric Constraints for Locally Aggregated
Descriptors", CVPR 2026, arXiv:2511.14109. Original code: CV4RA/A2GC (README says MIT; the code
does not run, so there are no weights to convert).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from aggzoo.hub.registry import register_model
from aggzoo.models.heads.a2gc import A2GC
from aggzoo.zoo._backbones import DINOV2_VITB14, head, vpr

__all__ = ["a2gc_dinov2_vitb14"]


@register_model
def a2gc_dinov2_vitb14(**kwargs: Any) -> nn.Module:
    """A^2GC-VPR (SALAD scores + geometric compatibility) on DINOv2 ViT-B/14: 8448-D."""
    return vpr(DINOV2_VITB14, head(A2GC), **kwargs)
