"""Input sizes a model can take: a ViT's patch multiple, a CNN's total stride, and the rounding to them.

A ViT cuts the image into ``p x p`` patches (DINOv2: 14), so a side that is not a multiple of ``p``
loses its last pixels; a CNN's last map has ``floor(side / stride)`` cells. The published protocols
therefore pick sizes that are multiples: SALAD / BoQ / ImAge evaluate DINOv2 at 322 x 322 (23 x 14),
MixVPR / BoQ-ResNet at 320 x 320 (a multiple of the stride 16 of layer3).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

__all__ = ["size_multiple", "snap_size"]


def size_multiple(model: nn.Module) -> int:
    """The side multiple a model wants: a ViT's patch size, else the total stride of its deepest map.

    Looks for a timm ``patch_embed.patch_size`` and for ``feature_info[-1]["reduction"]`` (aggzoo's
    :class:`~aggzoo.models.backbones.timm_backbone.TimmBackbone`); 1 when neither is found.
    """
    for module in model.modules():
        patch = getattr(getattr(module, "patch_embed", None), "patch_size", None)
        if patch is not None:
            return int(patch[0] if isinstance(patch, (tuple, list)) else patch)
    for module in model.modules():
        info = getattr(module, "feature_info", None)
        if isinstance(info, (list, tuple)) and info and isinstance(info[-1], dict) and "reduction" in info[-1]:
            return int(info[-1]["reduction"])
    return 1


def snap_size(size: float | Sequence[float], multiple: int) -> tuple[int, int]:
    """Round ``(H, W)`` to the nearest multiples of ``multiple`` (at least one multiple): 320 -> 322 for 14."""
    height, width = (size, size) if isinstance(size, (int, float)) else (float(size[0]), float(size[1]))
    snapped = [max(multiple, int(round(side / multiple)) * multiple) for side in (height, width)]
    return snapped[0], snapped[1]
