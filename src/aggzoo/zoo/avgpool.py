"""Global average pooling: the baseline every head is measured against.

No paper of its own: the mean of the last feature map, L2-normalised (the ``GAP`` rows of every
VPR comparison table).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from aggzoo.hub.registry import register_model
from aggzoo.models.heads.avgpool import AvgPool
from aggzoo.zoo._backbones import EFFICIENTNET_LITE0, head, vpr

__all__ = ["avgpool_efficientnet_lite0"]


@register_model
def avgpool_efficientnet_lite0(**kwargs: Any) -> nn.Module:
    """Global average pooling on EfficientNet-Lite0 (stride 16): 112-D. The baseline."""
    return vpr(EFFICIENTNET_LITE0, head(AvgPool), **kwargs)
