"""Multi-level AFA: attentive fusion of several backbone levels, then GeM, on EfficientNet-Lite0.

Y.-H. Yang, T. E. Huang, M. Sun, S. Rota Bulo, P. Kontschieder, F. Yu, "Dense Prediction with
Attentive Feature Aggregation", WACV 2023, arXiv:2111.00770. Original code: SysCV/dla-afa (no
licence file found). No VPR method aggregates more than the last stage: this head is new ground.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from aggzoo.hub.registry import register_model
from aggzoo.models.heads.afa import AFA
from aggzoo.zoo._backbones import EFFICIENTNET_LITE0_MULTILEVEL, head, vpr

__all__ = ["afa_efficientnet_lite0"]


@register_model
def afa_efficientnet_lite0(**kwargs: Any) -> nn.Module:
    """Multi-level AFA fusion of EfficientNet-Lite0 blocks 1/2/4, then GeM: 112-D."""
    return vpr(EFFICIENTNET_LITE0_MULTILEVEL, head(AFA), **kwargs)
