"""Multi-level IDA: iterative deep layer aggregation of several backbone levels, then GeM, on EfficientNet-Lite0.

F. Yu, D. Wang, E. Shelhamer, T. Darrell, "Deep Layer Aggregation", CVPR 2018, arXiv:1707.06484.
Original code: ucbdrive/dla (BSD-3-Clause). AFA's fusion without its attention (the ablation of
:mod:`aggzoo.zoo.afa`).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from aggzoo.hub.registry import register_model
from aggzoo.models.heads.ida import IDA
from aggzoo.zoo._backbones import EFFICIENTNET_LITE0_MULTILEVEL, head, vpr

__all__ = ["ida_efficientnet_lite0"]


@register_model
def ida_efficientnet_lite0(**kwargs: Any) -> nn.Module:
    """Multi-level IDA fusion (AFA without attention) of EfficientNet-Lite0 blocks 1/2/4: 112-D."""
    return vpr(EFFICIENTNET_LITE0_MULTILEVEL, head(IDA), **kwargs)
