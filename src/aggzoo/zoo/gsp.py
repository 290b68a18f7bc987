"""GSP: generalized sum pooling by partial optimal transport, on EfficientNet-Lite0.

Y. Z. Gurbuz, O. Sener, A. A. Alatan, "Generalized Sum Pooling for Metric Learning", ICCV 2023,
arXiv:2308.09228. Original code: yetigurbuz/generalized-sum-pooling (MIT). No VPR release: the
entry point is on the project's backbone, trainable offline.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from aggzoo.hub.registry import register_model
from aggzoo.models.heads.gsp import GSP
from aggzoo.zoo._backbones import EFFICIENTNET_LITE0, head, vpr

__all__ = ["gsp_efficientnet_lite0"]


@register_model
def gsp_efficientnet_lite0(**kwargs: Any) -> nn.Module:
    """Generalized sum pooling (Gurbuz et al., ICCV 2023) on EfficientNet-Lite0: 512-D."""
    return vpr(EFFICIENTNET_LITE0, head(GSP), **kwargs)
