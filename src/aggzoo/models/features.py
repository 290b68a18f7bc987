"""The value every backbone produces and every head consumes.

``Features`` is the one contract between the two halves of a VPR model: a backbone returns it, a
head reads what it needs from it (the last map, several maps, the CLS token or aggregation tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

__all__ = ["Features"]


@dataclass(frozen=True)
class Features:
    """Backbone output.

    Attributes:
        maps: feature maps ordered fine -> coarse, each ``[B, C_l, H_l, W_l]``. A single-level
            backbone gives a one-element tuple. ViT patch tokens arrive reshaped to a map.
        cls: the ViT class token ``[B, C]`` of the last level, or ``None`` for CNNs.
        tokens: extra learned tokens ``[B, T, C]`` (ImAge aggregation tokens), or ``None``.
        cls_levels: the class token of every level of ``maps``, fine -> coarse, each ``[B, C_l]``
            (``cls_levels[-1]`` is ``cls``), for heads that read the CLS of several blocks; ``None``
            where the backbone gives one level's CLS only, or none.
        cls_attention: ``[B, H*W]``: how much the class token attends to each patch of the last map in the
            last block (softmax attention, summed over heads; FoL's guidance), from a backbone that computes
            it (:class:`~aggzoo.models.backbones.class_attention.ClassAttentionViT`), else ``None``.
    """

    maps: tuple[Tensor, ...]
    cls: Tensor | None = None
    tokens: Tensor | None = None
    cls_levels: tuple[Tensor, ...] | None = None
    cls_attention: Tensor | None = None

    def __post_init__(self) -> None:
        if not self.maps:
            raise ValueError("Features needs at least one feature map")
        for level, fmap in enumerate(self.maps):
            if fmap.ndim != 4:
                raise ValueError(f"feature map {level} must be [B, C, H, W], got shape {tuple(fmap.shape)}")
        if self.cls_levels is not None and len(self.cls_levels) != len(self.maps):
            raise ValueError(f"cls_levels has {len(self.cls_levels)} entries for {len(self.maps)} feature maps")
        if self.cls_attention is not None:
            batch, _, height, width = self.maps[-1].shape
            if tuple(self.cls_attention.shape) != (batch, height * width):
                raise ValueError(f"cls_attention must be [B, H*W] = [{batch}, {height * width}] for the last map, "
                                 f"got shape {tuple(self.cls_attention.shape)}")

    @property
    def last(self) -> Tensor:
        """The coarsest map ``[B, C, H, W]``: what single-level heads aggregate."""
        return self.maps[-1]
