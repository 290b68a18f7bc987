"""The head contract: ``Features -> [B, D]`` L2-normalised descriptors."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from torch import Tensor, nn

from aggzoo.models.features import Features

__all__ = ["Head", "FeatureLevel"]

FeatureLevel = dict[str, Any]
"""One entry of a backbone's ``feature_info``: ``{"num_chs": int, "reduction": int, "module": str}``."""


class Head(nn.Module):
    """Base class of every aggregation head.

    Subclasses take ``in_channels`` as their first constructor argument, set ``self.out_dim`` and
    implement ``forward(features) -> [B, out_dim]`` with unit-norm rows. A head that needs several
    levels overrides :meth:`in_channels_from` so the model builder can hand it the right channels
    without any channel count being written in YAML.
    """

    out_dim: int
    #: True when the head's parameters are initialised from data by a callback before training.
    needs_data_init: ClassVar[bool] = False

    @classmethod
    def in_channels_from(cls, feature_info: Sequence[FeatureLevel]) -> int | tuple[int, ...]:
        """What to pass as ``in_channels`` for a backbone with this ``feature_info``: by default
        the channels of the last (coarsest) level."""
        return feature_info[-1]["num_chs"]

    def forward(self, features: Features) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError
