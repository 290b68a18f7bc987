"""MaxPool-CLS: MaxPoolBERT's layer- and token-wise CLS aggregation, on DINOv2 ViT-B/14.

M. Behrendt, S. S. Wagner, S. Harmeling, "MaxPoolBERT: Enhancing BERT Classification via Layer- and
Token-Wise Aggregation", arXiv:2505.15696 (BERT; ported here to ViT retrieval; no code found).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from aggzoo.hub.registry import register_model
from aggzoo.models.heads.maxpool_cls import MaxPoolCLS
from aggzoo.zoo._backbones import DINOV2_VITB14, head, vpr

__all__ = ["maxpool_cls_dinov2_vitb14"]


@register_model
def maxpool_cls_dinov2_vitb14(**kwargs: Any) -> nn.Module:
    """MaxPool-CLS over the last 3 blocks of DINOv2 ViT-B/14 (final norm on each), one 12-head attention layer: 768-D."""
    return vpr(dict(DINOV2_VITB14, out_indices=[-3, -2, -1]), head(MaxPoolCLS), **kwargs)
