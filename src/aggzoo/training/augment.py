"""The published recipes' training augmentation: resize, then torchvision's RandAugment.

GSV-Cities / ConvAP and CosPlace-style training use ``RandAugment(num_ops=2)``, MixVPR and SALAD
``RandAugment(num_ops=3)`` (magnitude 9 of 31 bins, bilinear), BoQ ``RandAugment(num_ops=3,
magnitude=15)`` after a bicubic resize; none flips. torchvision's RandAugment draws from the
global torch RNG, which :class:`~aggzoo.training.samplers.EpochKeyedDataset` seeds per item.

Select it in a data config (the default pipeline uses ``aggzoo.data.transforms.train_transform``)::

    data:
      augmentation:
        _target_: aggzoo.training.augment.rand_augment
        _partial_: true
        num_ops: 3
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np
import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torchvision.transforms import InterpolationMode, RandAugment

from aggzoo.data.transforms import Transform

__all__ = ["rand_augment"]

_CV2 = {"bilinear": cv2.INTER_LINEAR, "bicubic": cv2.INTER_CUBIC, "nearest": cv2.INTER_NEAREST}
_TV = {"bilinear": InterpolationMode.BILINEAR, "bicubic": InterpolationMode.BICUBIC,
       "nearest": InterpolationMode.NEAREST}


class _RandAugmentPipeline:
    """``rgb uint8 [H, W, 3] -> float [3, H', W']``: resize, RandAugment on uint8, normalise."""

    def __init__(self, image_size: Sequence[int], mean: Sequence[float], std: Sequence[float], num_ops: int,
                 magnitude: int, resize_interpolation: str, interpolation: str) -> None:
        for name in (resize_interpolation, interpolation):
            if name not in _CV2:
                raise ValueError(f"interpolation must be one of {sorted(_CV2)}, got {name!r}")
        self.size = (int(image_size[0]), int(image_size[1]))
        self.resize_flag = _CV2[resize_interpolation]
        self.augment = RandAugment(num_ops=num_ops, magnitude=magnitude, interpolation=_TV[interpolation])
        self.mean = torch.tensor(mean, dtype=torch.float32).view(3, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(3, 1, 1)

    def __call__(self, image: np.ndarray) -> torch.Tensor:
        height, width = self.size
        resized = cv2.resize(image, (width, height), interpolation=self.resize_flag)
        chw = torch.from_numpy(np.ascontiguousarray(resized.transpose(2, 0, 1)))
        augmented = self.augment(chw).float().div_(255.0)
        return (augmented - self.mean) / self.std

    def __repr__(self) -> str:
        return f"RandAugmentPipeline(size={self.size}, {self.augment!r})"


def rand_augment(image_size: Sequence[int], *, mean: Sequence[float] = IMAGENET_DEFAULT_MEAN,
                 std: Sequence[float] = IMAGENET_DEFAULT_STD, num_ops: int = 3, magnitude: int = 9,
                 resize_interpolation: str = "bilinear", interpolation: str = "bilinear") -> Transform:
    """Resize to ``image_size = (H, W)``, apply ``RandAugment(num_ops, magnitude)`` and normalise.

    Args:
        num_ops: operations per image (GSV-Cities 2, MixVPR / SALAD / BoQ 3).
        magnitude: strength bin out of 31 (torchvision default 9; BoQ 15).
        resize_interpolation: kernel of the initial resize (BoQ: bicubic).
        interpolation: kernel of RandAugment's geometric operations.
    """
    return _RandAugmentPipeline(image_size, mean, std, num_ops, magnitude, resize_interpolation, interpolation)
