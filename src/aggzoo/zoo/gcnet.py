"""GCNet's global-context block as a head (then GeM), on EfficientNet-Lite0.

Y. Cao, J. Xu, S. Lin, F. Wei, H. Hu, "GCNet: Non-local Networks Meet Squeeze-Excitation Networks
and Beyond", ICCVW 2019, arXiv:1904.11492. Original code: xvjiarui/GCNet (no licence file found).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from aggzoo.hub.registry import register_model
from aggzoo.models.heads.gcnet import GCNet
from aggzoo.zoo._backbones import EFFICIENTNET_LITE0, head, vpr

__all__ = ["gcnet_efficientnet_lite0"]


@register_model
def gcnet_efficientnet_lite0(**kwargs: Any) -> nn.Module:
    """GCNet global-context block + GeM on EfficientNet-Lite0: 112-D."""
    return vpr(EFFICIENTNET_LITE0, head(GCNet), **kwargs)
