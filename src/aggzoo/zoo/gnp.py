"""GNP: generalized (learned-)norm pooling on EfficientNet-Lite0.

C. Gulcehre, K. Cho, R. Pascanu, Y. Bengio, "Learned-Norm Pooling for Deep Feedforward and
Recurrent Neural Networks", ECML-PKDD 2014, arXiv:1311.1780. No VPR release: the entry point is
on the project's backbone, trainable offline.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from aggzoo.hub.registry import register_model
from aggzoo.models.heads.gnp import GNP
from aggzoo.zoo._backbones import EFFICIENTNET_LITE0, head, vpr

__all__ = ["gnp_efficientnet_lite0"]


@register_model
def gnp_efficientnet_lite0(**kwargs: Any) -> nn.Module:
    """Generalized norm pooling (a learned order per channel) on EfficientNet-Lite0 (stride 16): 112-D."""
    return vpr(EFFICIENTNET_LITE0, head(GNP), **kwargs)
