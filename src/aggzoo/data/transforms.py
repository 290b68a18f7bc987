"""albumentations pipelines: training augmentation and evaluation resize + normalise.

Both return a callable ``rgb uint8 [H, W, 3] -> float tensor [3, H', W']``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

import albumentations as A
import cv2
import numpy as np
import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

__all__ = ["CentreCropToMultiple", "Transform", "eval_transform", "inception_crop", "train_transform"]

Transform = Callable[[np.ndarray], torch.Tensor]

_INTERPOLATION = {
    "nearest": cv2.INTER_NEAREST,
    "bilinear": cv2.INTER_LINEAR,
    "bicubic": cv2.INTER_CUBIC,
    "area": cv2.INTER_AREA,
}


class _Pipeline:
    """albumentations ``Compose`` followed by HWC float -> CHW tensor (picklable for workers)."""

    def __init__(self, compose: A.Compose) -> None:
        self.compose = compose

    def __call__(self, image: np.ndarray) -> torch.Tensor:
        out = self.compose(image=image)["image"]
        return torch.from_numpy(np.ascontiguousarray(out.transpose(2, 0, 1)))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.compose!r})"


def _resize(size: Sequence[int], interpolation: str) -> A.BasicTransform:
    height, width = int(size[0]), int(size[1])
    if interpolation not in _INTERPOLATION:
        raise ValueError(f"interpolation must be one of {sorted(_INTERPOLATION)}, got {interpolation!r}")
    return A.Resize(height=height, width=width, interpolation=_INTERPOLATION[interpolation])


def eval_transform(
    image_size: Sequence[int],
    *,
    mean: Sequence[float] = IMAGENET_DEFAULT_MEAN,
    std: Sequence[float] = IMAGENET_DEFAULT_STD,
    interpolation: str = "bicubic",
) -> Transform:
    """Resize to ``image_size = (H, W)`` and normalise.

    Bicubic by default, as the published VPR protocols (SALAD, BoQ) evaluate. When shrinking,
    OpenCV's area interpolation is used instead because it is the anti-aliased choice.
    """
    return _Pipeline(A.Compose([
        _AntialiasedResize(image_size, interpolation),
        A.Normalize(mean=tuple(mean), std=tuple(std), max_pixel_value=255.0),
    ]))


class _AntialiasedResize(A.ImageOnlyTransform):
    """Resize that averages (INTER_AREA) when shrinking by more than 2x, so small images are not
    aliased, and interpolates with the requested kernel otherwise."""

    def __init__(self, size: Sequence[int], interpolation: str) -> None:
        super().__init__(p=1.0)
        self.size = (int(size[0]), int(size[1]))
        self.interpolation = _INTERPOLATION[interpolation]

    def apply(self, img: np.ndarray, **params: object) -> np.ndarray:
        height, width = self.size
        shrink = min(img.shape[0] / height, img.shape[1] / width)
        flag = cv2.INTER_AREA if shrink >= 2.0 else self.interpolation
        return cv2.resize(img, (width, height), interpolation=flag)

    def get_transform_init_args_names(self) -> tuple[str, ...]:
        return ("size", "interpolation")


def train_transform(
    image_size: Sequence[int],
    *,
    mean: Sequence[float] = IMAGENET_DEFAULT_MEAN,
    std: Sequence[float] = IMAGENET_DEFAULT_STD,
    interpolation: str = "bilinear",
    strength: float = 1.0,
) -> Transform:
    """GSV-Cities-style augmentation: photometric changes (RandAugment-like), mild geometric
    jitter, no flips (a mirrored street is a different place).

    Args:
        image_size: output ``(H, W)``.
        strength: scales the probability of each augmentation; 0 disables augmentation.
    """
    p = float(strength)
    return _Pipeline(A.Compose([
        A.RandomResizedCrop(size=(int(image_size[0]), int(image_size[1])), scale=(0.7, 1.0),
                            ratio=(0.8, 1.25), interpolation=_INTERPOLATION[interpolation], p=min(1.0, 0.5 * p)),
        _resize(image_size, interpolation),
        A.ColorJitter(brightness=0.3, contrast=0.3, saturation=0.3, hue=0.05, p=min(1.0, 0.8 * p)),
        A.OneOf([A.GaussianBlur(blur_limit=(3, 5)), A.GaussNoise(std_range=(0.02, 0.08))], p=min(1.0, 0.3 * p)),
        A.ToGray(p=min(1.0, 0.1 * p)),
        A.Normalize(mean=tuple(mean), std=tuple(std), max_pixel_value=255.0),
    ]))


class CentreCropToMultiple:
    """``transform`` followed by the largest centred crop whose sides are multiples of ``multiple``
    (a ViT's patch size): AnyLoc's ``CenterCrop((H // 14 * 14, W // 14 * 14))`` after its resize
    (320 x 320 -> 308 x 308). ``rgb uint8 [H, W, 3] -> float tensor [3, H', W']``; picklable for workers."""

    def __init__(self, transform: Transform, multiple: int) -> None:
        if multiple < 1:
            raise ValueError(f"multiple must be >= 1, got {multiple}")
        self.transform = transform
        self.multiple = int(multiple)

    def __call__(self, image: np.ndarray) -> torch.Tensor:
        out = self.transform(image)
        height, width = out.shape[-2:]
        crop_h, crop_w = height // self.multiple * self.multiple, width // self.multiple * self.multiple
        # torchvision's CenterCrop rounds the offsets: int(round((H - h) / 2))
        top, left = int(round((height - crop_h) / 2)), int(round((width - crop_w) / 2))
        return out[..., top:top + crop_h, left:left + crop_w]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.transform!r}, multiple={self.multiple})"


def inception_crop(
    image_size: Sequence[int],
    *,
    mean: Sequence[float] = IMAGENET_DEFAULT_MEAN,
    std: Sequence[float] = IMAGENET_DEFAULT_STD,
    scale: Sequence[float] = (0.1, 1.0),
    ratio: Sequence[float] = (3 / 4, 4 / 3),
    interpolation: str = "area",
) -> Transform:
    """ImageNet-style ("Inception") random crop, resized to ``image_size = (H, W)``, then normalised; no flip,
    no photometric change: DELG's training augmentation (tensorflow/models research/delf
    ``datasets/googlelandmarks.py`` ``_ImageNetCrop``: ``sample_distorted_bounding_box`` with area 0.08-1.0 of
    which at least ``min_object_covered`` 0.1 -- so ``scale`` 0.1-1.0 --, aspect 3/4-4/3, area resize,
    ``random_reflection`` False).

    Args:
        scale: the crop's area as a fraction of the image's, drawn uniformly in this range.
        ratio: the crop's aspect ratio (width / height), drawn log-uniformly in this range.
    """
    if interpolation not in _INTERPOLATION:
        raise ValueError(f"interpolation must be one of {sorted(_INTERPOLATION)}, got {interpolation!r}")
    return _Pipeline(A.Compose([
        A.RandomResizedCrop(size=(int(image_size[0]), int(image_size[1])), scale=tuple(scale), ratio=tuple(ratio),
                            interpolation=_INTERPOLATION[interpolation], p=1.0),
        A.Normalize(mean=tuple(mean), std=tuple(std), max_pixel_value=255.0),
    ]))
