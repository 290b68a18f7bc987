"""Multi-scale descriptors: one model run at several input scales, pooled into one descriptor.

Each scale ``s`` resizes the batch (antialiased), the model's L2-normalised descriptors ``d_s`` are
averaged (``reduce="mean"``, the usual multi-scale test) or max-pooled elementwise (``reduce="max"``)
and the result is L2-normalised. It wraps any ``image -> [B, D]`` model and changes no weights.

SuperGlobal's scale-GeM is ``MultiScale(model, reduce="max", interpolation="bilinear")``: S. Shao,
K. Chen, A. Karpur, Q. Cui, A. Araujo, B. Cao, "Global Features are All You Need for Image Retrieval
and Reranking", ICCV 2023, arXiv:2308.06954 (ShihaoShao-GH/SuperGlobal ``model/resnet.py``,
``modules/coarse_retrieval/sgem.py``, MIT): scales 1/sqrt(2), 1, sqrt(2), each image resized to
``(floor(s*H), floor(s*W))`` bilinearly with antialiasing (torchvision's tensor ``resize``), and the
elementwise max (the ``p -> inf`` limit of its power mean over scales).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aggzoo.models.input_size import snap_size

__all__ = ["MultiScale", "resize_by"]

_INTERPOLATIONS = ("bicubic", "bilinear")


def resize_by(images: Tensor, scale: float, *, multiple: int = 1, interpolation: str = "bicubic") -> Tensor:
    """``[B, 3, H, W] -> [B, 3, h, w]`` antialiased: ``(floor(s*H), floor(s*W))`` for ``multiple=1``
    (torchvision's rule), else the nearest multiples of ``multiple`` (:func:`snap_size`). The
    identity when the size does not change."""
    height, width = images.shape[-2:]
    if multiple > 1:
        size = snap_size((height * scale, width * scale), multiple)
    else:
        size = (int(height * scale), int(width * scale))
    if size == (height, width):
        return images
    if min(size) < 1:
        raise ValueError(f"scale {scale} shrinks a {height}x{width} image to nothing")
    return F.interpolate(images, size=size, mode=interpolation, align_corners=False, antialias=True)


class MultiScale(nn.Module):
    """Descriptors pooled over several input scales (see the module docstring).

    Args:
        model: any module mapping images ``[B, 3, H, W]`` to descriptors ``[B, D]``; must accept
            every resized size (a fixed-size head such as MixVPR does not).
        scales: image scale factors (SuperGlobal: 0.7071, 1, 1.4142).
        reduce: ``"mean"`` or ``"max"`` over the scales.
        multiple: round sizes to multiples of this (a ViT's patch size); 1 floors them.
        interpolation: ``"bicubic"`` (the VPR protocols) or ``"bilinear"`` (SuperGlobal).

    Shapes: ``images [B, 3, H, W] -> [B, D]`` unit-norm rows; ``out_dim`` is the model's. Load
    weights into ``model`` before wrapping: the wrapper's own state-dict keys gain a ``model.`` prefix.
    """

    def __init__(self, model: nn.Module, scales: Sequence[float] = (0.7071, 1.0, 1.4142), *,
                 reduce: str = "mean", multiple: int = 1, interpolation: str = "bicubic") -> None:
        super().__init__()
        if reduce not in ("mean", "max"):
            raise ValueError(f"reduce must be 'mean' or 'max', got {reduce!r}")
        if interpolation not in _INTERPOLATIONS:
            raise ValueError(f"interpolation must be one of {_INTERPOLATIONS}, got {interpolation!r}")
        if not scales or any(s <= 0 for s in scales):
            raise ValueError(f"MultiScale needs at least one positive scale, got {tuple(scales)}")
        self.model = model
        self.scales = tuple(float(s) for s in scales)
        self.reduce = reduce
        self.multiple = int(multiple)
        self.interpolation = interpolation

    @property
    def out_dim(self) -> int:
        return self.model.out_dim

    def forward(self, images: Tensor) -> Tensor:
        pooled: Tensor | None = None
        for scale in self.scales:
            resized = resize_by(images, scale, multiple=self.multiple, interpolation=self.interpolation)
            desc = F.normalize(self.model(resized).float(), dim=-1)
            if pooled is None:
                pooled = desc
            elif self.reduce == "mean":
                pooled = pooled + desc
            else:
                pooled = torch.maximum(pooled, desc)
        return F.normalize(pooled, dim=-1)
