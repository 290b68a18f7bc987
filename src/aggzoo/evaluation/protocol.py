"""The evaluation resize of the published VPR protocols.

The protocols evaluate at sizes that are multiples of the backbone's patch size or stride
(:mod:`aggzoo.models.input_size`): :func:`~aggzoo.models.input_size.snap_size` rounds a requested
size to the nearest multiple of :func:`~aggzoo.models.input_size.size_multiple`. The resize is
bicubic with antialiasing, as ``torchvision.transforms.Resize(..., interpolation=BICUBIC,
antialias=True)`` does on PIL images in those codebases: :func:`protocol_transform` uses PIL's
resampling, which is exactly that operation.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torch import Tensor

from aggzoo.models.input_size import snap_size

__all__ = ["protocol_transform"]


class _PILBicubic:
    """``rgb uint8 [H, W, 3] -> float [3, h, w]``: PIL bicubic resize (antialiased) + normalisation."""

    def __init__(self, size: tuple[int, int], mean: Sequence[float], std: Sequence[float]) -> None:
        self.size = size
        self.mean = np.asarray(mean, dtype=np.float32).reshape(3, 1, 1)
        self.std = np.asarray(std, dtype=np.float32).reshape(3, 1, 1)

    def __call__(self, image: np.ndarray) -> Tensor:
        height, width = self.size
        resized = np.asarray(Image.fromarray(image).resize((width, height), Image.Resampling.BICUBIC))
        chw = resized.transpose(2, 0, 1).astype(np.float32) / 255.0
        return torch.from_numpy(np.ascontiguousarray((chw - self.mean) / self.std))

    def __repr__(self) -> str:
        return f"protocol_transform(size={self.size}, bicubic, antialias)"


def protocol_transform(
    image_size: int | Sequence[int],
    *,
    multiple: int = 1,
    mean: Sequence[float] = IMAGENET_DEFAULT_MEAN,
    std: Sequence[float] = IMAGENET_DEFAULT_STD,
) -> _PILBicubic:
    """The published evaluation transform: resize to ``snap_size(image_size, multiple)`` with PIL bicubic
    (antialiased), scale to [0, 1], normalise. Picklable, for ``num_workers > 0``."""
    return _PILBicubic(snap_size(image_size, multiple), mean, std)
