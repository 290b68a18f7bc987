"""Resampling a ViT's absolute position embedding to another patch grid, the way DINOv2 does.

facebookresearch/dinov2 ``models/vision_transformer.py`` (``interpolate_pos_encoding``, Apache-2.0;
re-implemented from its arithmetic) keeps the position grid its checkpoint was trained with
(``M x M`` = 37 x 37, 518 px) and, for every input, resamples it once to the input's patch grid
``(g_h, g_w)``: bicubic, ``scale_factor = ((g_h + 0.1) / M, (g_w + 0.1) / M)`` (the historical
``interpolate_offset`` 0.1), no antialiasing, in float32; the class position is kept as it is, and the
grid is used unchanged when it already has the input's size. The scale factor, not the output size,
sets the sampling positions, so the result differs from a resize to ``(g_h, g_w)`` (timm's rule) and from
resampling an already resampled grid a second time.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

__all__ = ["DINOV2_INTERPOLATE_OFFSET", "resample_grid_dinov2"]

#: DINOv2's ``interpolate_offset`` (default 0.1).
DINOV2_INTERPOLATE_OFFSET = 0.1


def resample_grid_dinov2(patches: Tensor, source: tuple[int, int], target: tuple[int, int]) -> Tensor:
    """``patches: [1, S_h * S_w, C]`` positions of a ``source = (S_h, S_w)`` grid (row-major) ->
    ``[1, g_h * g_w, C]`` for ``target = (g_h, g_w)``, by DINOv2's rule (module docstring), in the input dtype."""
    source, target = (int(source[0]), int(source[1])), (int(target[0]), int(target[1]))
    if source == target:
        return patches
    channels = patches.shape[-1]
    if patches.shape[1] != source[0] * source[1]:
        raise ValueError(f"{patches.shape[1]} positions do not fill a {source[0]} x {source[1]} grid")
    scale = tuple((g + DINOV2_INTERPOLATE_OFFSET) / s for g, s in zip(target, source, strict=True))
    grid = patches.float().reshape(1, source[0], source[1], channels).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, scale_factor=scale, mode="bicubic", antialias=False)
    if tuple(grid.shape[-2:]) != target:  # cannot happen with the 0.1 offset; guards a changed rule
        raise ValueError(f"resampling positions {source} -> {target} gave {tuple(grid.shape[-2:])}")
    return grid.permute(0, 2, 3, 1).reshape(1, target[0] * target[1], channels).to(patches.dtype)
