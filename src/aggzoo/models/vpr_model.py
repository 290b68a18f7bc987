"""A VPR model: one backbone and one head."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from aggzoo.models.features import Features
from aggzoo.models.heads.base import Head

__all__ = ["VPRModel", "build_head"]


def build_head(head_factory: Callable[..., Head], backbone: nn.Module) -> Head:
    """Complete a head constructor (a class or a ``functools.partial`` of one, e.g. from a Hydra
    ``_partial_: true`` config) with the ``in_channels`` the backbone provides.

    The head class decides which channels it needs (:meth:`Head.in_channels_from`), so a YAML file
    never repeats a channel count. A head that fuses more levels than the backbone returns
    (:attr:`Head.min_levels`, per instance) is refused here, before any image is seen.
    """
    head_cls = getattr(head_factory, "func", head_factory)
    in_channels = head_cls.in_channels_from(backbone.feature_info)
    head = head_factory(in_channels)
    levels = len(backbone.feature_info)
    if levels < head.min_levels:
        deepest = ", ".join(str(-i) for i in range(head.min_levels, 0, -1))
        raise ValueError(f"{type(head).__name__} fuses at least {head.min_levels} backbone levels, the backbone returns "
                         f"{levels}: give it more out_indices (e.g. backbone.out_indices=[{deepest}])")
    return head


class VPRModel(nn.Module):
    """``image [B, 3, H, W] -> backbone -> Features -> head -> descriptor [B, D]`` (unit norm).

    Args:
        backbone: a module returning :class:`Features` and exposing ``feature_info``.
        head: a :class:`Head`, or a callable that builds one from ``in_channels``.
    """

    def __init__(self, backbone: nn.Module, head: Head | Callable[..., Head]) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head if isinstance(head, nn.Module) else build_head(head, backbone)

    @property
    def out_dim(self) -> int:
        return self.head.out_dim

    def forward_features(self, images: Tensor) -> Features:
        return self.backbone(images)

    def forward(self, images: Tensor) -> Tensor:
        return self.head(self.backbone(images))
