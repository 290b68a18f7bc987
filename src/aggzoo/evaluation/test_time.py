"""Test-time resolution, multi-scale extraction and TLC, as the published VPR protocols use them.

Resolution rules. A ViT cuts the image into ``p x p`` patches (DINOv2: 14), so a side that is not a
multiple of ``p`` loses its last pixels; a CNN's last map has ``floor(side / stride)`` cells. The
protocols therefore pick sizes that are multiples: SALAD / BoQ / ImAge evaluate DINOv2 at 322 x 322
(23 x 14), MixVPR / BoQ-ResNet at 320 x 320 (a multiple of the stride 16 of layer3). :func:`snap_size`
rounds a requested size to the nearest multiple of :func:`size_multiple` (the backbone's patch size or
total stride). The resize is bicubic with antialiasing, as ``torchvision.transforms.Resize(...,
interpolation=BICUBIC, antialias=True)`` does on PIL images in those codebases: :func:`protocol_transform`
uses PIL's resampling, which is exactly that operation.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor, nn

from aggzoo.data.transforms import IMAGENET_MEAN, IMAGENET_STD

__all__ = ["size_multiple", "snap_size", "protocol_transform", "MultiScale", "with_tlc"]


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
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
) -> _PILBicubic:
    """The published evaluation transform: resize to ``snap_size(image_size, multiple)`` with PIL bicubic
    (antialiased), scale to [0, 1], normalise. Picklable, for ``num_workers > 0``."""
    return _PILBicubic(snap_size(image_size, multiple), mean, std)


class MultiScale(nn.Module):
    """Descriptors pooled over several input scales.

    Each scale ``s`` resizes the batch to ``snap_size((s*H, s*W), multiple)`` (bicubic, antialiased), the
    model's L2-normalised descriptors are averaged (``reduce="mean"``, the usual multi-scale test) or
    max-pooled elementwise (``reduce="max"``, SuperGlobal's scale-GeM with p -> inf, as
    :class:`aggzoo.models.scale_gem.ScaleGeM`), and the result is L2-normalised.

    Shapes: ``images [B, 3, H, W] -> [B, D]``.
    """

    def __init__(self, model: nn.Module, scales: Sequence[float] = (0.7071, 1.0, 1.4142), *,
                 reduce: str = "mean", multiple: int = 1) -> None:
        super().__init__()
        if reduce not in ("mean", "max"):
            raise ValueError(f"reduce must be 'mean' or 'max', got {reduce!r}")
        if not scales or any(s <= 0 for s in scales):
            raise ValueError(f"scales must be positive, got {tuple(scales)}")
        self.model = model
        self.scales = tuple(float(s) for s in scales)
        self.reduce = reduce
        self.multiple = int(multiple)

    @property
    def out_dim(self) -> int:
        return self.model.out_dim

    def forward(self, images: Tensor) -> Tensor:
        height, width = images.shape[-2:]
        pooled: Tensor | None = None
        for scale in self.scales:
            size = snap_size((height * scale, width * scale), self.multiple)
            resized = images if size == (height, width) else F.interpolate(
                images, size=size, mode="bicubic", align_corners=False, antialias=True)
            desc = F.normalize(self.model(resized).float(), dim=-1)
            if pooled is None:
                pooled = desc
            elif self.reduce == "mean":
                pooled = pooled + desc
            else:
                pooled = torch.maximum(pooled, desc)
        return F.normalize(pooled, dim=-1)


def with_tlc(model: nn.Module, train_size: int | Sequence[int], base_ratio: float = 1.5) -> nn.Module:
    """A TLC-converted *copy* of ``model`` (the caller's model is left as it is).

    Calls :func:`aggzoo.models.tlc.convert_tlc` (Chu et al., ECCV 2022), which swaps the global statistics
    inside attention / normalisation blocks for local windows sized from ``train_size``.
    """
    try:
        from aggzoo.models.tlc import convert_tlc
    except ImportError as err:  # pragma: no cover - present in this repository
        raise ImportError("TLC needs aggzoo.models.tlc.convert_tlc") from err
    size = train_size if isinstance(train_size, int) else tuple(int(s) for s in train_size)
    return convert_tlc(copy.deepcopy(model), size, base_ratio)
