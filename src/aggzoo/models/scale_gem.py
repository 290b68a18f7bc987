"""Scale-GeM: SuperGlobal's multi-scale descriptor, as a test-time wrapper of a whole model.

S. Shao, K. Chen, A. Karpur, Q. Cui, A. Araujo, B. Cao, "Global Features are All You Need for
Image Retrieval and Reranking", ICCV 2023, arXiv:2308.06954. Original code:
ShihaoShao-GH/SuperGlobal ``model/resnet.py`` and ``modules/coarse_retrieval/sgem.py`` (MIT);
re-implemented from the paper, with the scales and resizing checked against that code.

For scales ``s_1..s_S`` (paper: 1/sqrt(2), 1, sqrt(2)) the image is resized to
``(floor(s*H), floor(s*W))`` (bilinear, antialiased), each resized image gives an L2-normalised
descriptor ``d_s``, and the result is ``L2(max_s d_s)`` (elementwise max, the ``p -> inf`` limit of
SuperGlobal's power mean over scales). It wraps any ``image -> [B, D]`` model, typically a
:class:`~aggzoo.models.vpr_model.VPRModel` with a GeM+ head, and changes no weights.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["ScaleGeM", "resize_by"]


def resize_by(images: Tensor, scale: float) -> Tensor:
    """``[B, 3, H, W] -> [B, 3, floor(s*H), floor(s*W)]``, bilinear with antialiasing (the
    behaviour of torchvision's tensor ``resize`` that the authors call). Scale 1 is the identity."""
    height, width = images.shape[-2:]
    size = (int(height * scale), int(width * scale))
    if size == (height, width):
        return images
    if min(size) < 1:
        raise ValueError(f"scale {scale} shrinks a {height}x{width} image to nothing")
    return F.interpolate(images, size=size, mode="bilinear", align_corners=False, antialias=True)


class ScaleGeM(nn.Module):
    """Multi-scale max of a model's descriptors.

    Args:
        model: any module mapping images ``[B, 3, H, W]`` to descriptors ``[B, D]``; must accept
            every resized size (a fixed-size head such as MixVPR does not).
        scales: image scale factors (paper code: 0.7071, 1, 1.4142).

    Shapes: ``images: [B, 3, H, W] -> [B, D]`` unit-norm rows. ``out_dim`` is the model's.
    Load weights into ``model`` before wrapping: the wrapper's own state-dict keys gain a
    ``model.`` prefix.
    """

    def __init__(self, model: nn.Module, scales: Sequence[float] = (0.7071, 1.0, 1.4142)) -> None:
        super().__init__()
        if not scales or any(s <= 0 for s in scales):
            raise ValueError(f"ScaleGeM needs at least one positive scale, got {tuple(scales)}")
        self.model = model
        self.scales = tuple(float(s) for s in scales)

    @property
    def out_dim(self) -> int:
        return self.model.out_dim

    def forward(self, images: Tensor) -> Tensor:
        pooled: Tensor | None = None
        for scale in self.scales:
            desc = F.normalize(self.model(resize_by(images, scale)), dim=-1)
            pooled = desc if pooled is None else torch.maximum(pooled, desc)
        return F.normalize(pooled, dim=-1)
