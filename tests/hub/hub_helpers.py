"""Helpers shared by the hub tests (imported as a top-level module: pytest puts this folder on sys.path)."""

from __future__ import annotations

from typing import Any

import torch

from aggzoo.models.heads.gem import GeM
from aggzoo.zoo._backbones import backbone, head, vpr

TINY_BACKBONE = backbone("test_resnet", out_indices=[3])
TINY_NAME = "gem_testresnet"


def tiny_model(**kwargs: Any) -> torch.nn.Module:
    """GeM on timm's test_resnet cut at stride 16 (192 channels)."""
    return vpr(TINY_BACKBONE, head(GeM, p=3.0, eps=1e-6, learn_p=True), **kwargs)


tiny_model.__name__ = TINY_NAME


def images(batch: int = 2, size: tuple[int, int] = (64, 64), seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, 3, *size, generator=torch.Generator().manual_seed(seed))
