"""The optimal-transport heads and the ImAge head build at the paper configuration from their YAML
(``in_channels=768``, DINOv2 ViT-B/14) and give the paper's descriptor size."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from aggzoo.models.features import Features

CONF = Path(__file__).resolve().parents[2] / "conf" / "head"

PAPER_SIZES = {
    "salad": 8448,  # 64 * 128 + 256
    "salad544": 544,  # 16 * 32 + 32
    "megaloc": 8448,  # Linear(64 * 256 + 256 -> 8448)
    "a2gc": 8448,
    "gsp": 512,
    "qaa": 8192,  # 64 * 128
    "image": 6144,  # 8 * 768
}


@pytest.mark.parametrize("name", sorted(PAPER_SIZES))
def test_builds_at_paper_configuration(name: str) -> None:
    head = instantiate(OmegaConf.load(CONF / f"{name}.yaml"))(768).eval()
    assert head.out_dim == PAPER_SIZES[name]
    gen = torch.Generator().manual_seed(0)
    feats = Features(maps=(torch.randn(1, 768, 16, 16, generator=gen),), cls=torch.randn(1, 768, generator=gen),
                     tokens=torch.randn(1, 8, 768, generator=gen))
    with torch.no_grad():
        out = head(feats)
    assert out.shape == (1, PAPER_SIZES[name])
    torch.testing.assert_close(out.norm(dim=1), torch.ones(1), atol=1e-5, rtol=0)
