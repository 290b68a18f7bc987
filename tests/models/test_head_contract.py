"""The head contract, checked for every ``conf/head/*.yaml`` on a tiny timm backbone.

A new head is tested here the moment its YAML exists: output shape = ``out_dim``, unit norm,
batch size 1, finite values, a gradient for every trainable parameter, identical outputs after a
state-dict round trip, and bf16 autocast on CPU without NaN.

Heads that need a particular backbone (a CLS token, several levels, a fixed map size) get an entry
in ``SETUPS``; everything else runs on ``test_resnet`` cut after its stride-16 stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from aggzoo.models.backbones.aggregation_tokens import AggregationTokenViT
from aggzoo.models.backbones.timm_backbone import TimmBackbone
from aggzoo.models.vpr_model import VPRModel

HEAD_CONFIGS = sorted((Path(__file__).resolve().parents[2] / "conf" / "head").glob("*.yaml"))


@dataclass(frozen=True)
class Setup:
    backbone: str = "test_resnet"
    backbone_kwargs: dict[str, Any] = field(default_factory=lambda: {"out_indices": (3,)})
    image_size: tuple[int, int] = (128, 128)  # -> 8 x 8 map at stride 16
    head_overrides: dict[str, Any] = field(default_factory=dict)
    backbone_cls: type = TimmBackbone  # a TimmBackbone subclass (e.g. one that inserts tokens)


VIT = Setup(backbone="test_vit", backbone_kwargs={"dynamic_img_size": True}, image_size=(160, 160))
SETUPS: dict[str, Setup] = {
    # name of conf/head/<name>.yaml -> Setup
    "mixvpr": Setup(head_overrides={"in_h": 8, "in_w": 8}),  # 128x128 images -> 8x8 maps at stride 16
    "boq_dinov2": VIT,
    "edtformer": VIT,  # reads the class token
    "salad": VIT,  # reads the class token; 10x10 = 100 patches > 64 clusters
    "salad544": VIT,
    # paper config's Linear(16640 -> 8448) is 140M parameters: keep the structure, shrink the widths
    "megaloc": Setup(backbone="test_vit", backbone_kwargs={"dynamic_img_size": True}, image_size=(160, 160),
                     head_overrides={"cluster_dim": 32, "feat_dim": 512}),
    "a2gc": VIT,
    "image": Setup(backbone="test_vit", backbone_cls=AggregationTokenViT, image_size=(160, 160),
                          backbone_kwargs={"num_tokens": 8, "insert_before_block": 4, "dynamic_img_size": True}),
    "afa": Setup(backbone_kwargs={"out_indices": (2, 3, 4)}),  # multi-level: 16x16, 8x8, 4x4 maps
    "ida": Setup(backbone_kwargs={"out_indices": (2, 3, 4)}),
}


def _build(config_path: Path, seed: int = 0) -> tuple[VPRModel, Setup]:
    setup = SETUPS.get(config_path.stem, Setup())
    torch.manual_seed(seed)
    backbone = setup.backbone_cls(setup.backbone, **setup.backbone_kwargs)
    cfg = OmegaConf.merge(OmegaConf.load(config_path), setup.head_overrides)
    return VPRModel(backbone, instantiate(cfg)), setup


def _images(setup: Setup, batch: int, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 3, *setup.image_size, generator=gen)


@pytest.fixture(params=HEAD_CONFIGS, ids=[p.stem for p in HEAD_CONFIGS])
def head_config(request: pytest.FixtureRequest) -> Path:
    return request.param


def test_every_config_targets_its_constructor_keys(head_config: Path) -> None:
    import inspect

    cfg = OmegaConf.to_container(OmegaConf.load(head_config))
    assert cfg.get("_partial_") is True, "heads are completed with in_channels at build time"
    target = instantiate({"_target_": "hydra.utils.get_class", "path": cfg["_target_"]})
    params = inspect.signature(target.__init__).parameters
    for key in cfg:
        if not key.startswith("_"):
            assert key in params, f"{head_config.name}: key {key!r} is not a constructor argument of {target}"


@pytest.mark.parametrize("batch", [1, 3])
def test_shape_norm_and_finite(head_config: Path, batch: int) -> None:
    model, setup = _build(head_config)
    model.eval()
    with torch.no_grad():
        out = model(_images(setup, batch))
    assert out.shape == (batch, model.out_dim)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.norm(dim=1), torch.ones(batch), atol=1e-4, rtol=0)


def test_every_parameter_gets_a_gradient(head_config: Path) -> None:
    model, setup = _build(head_config)
    model.train()
    out = model(_images(setup, 4))
    # A loss that depends on every output coordinate with distinct weights.
    weights = torch.linspace(-1.0, 1.0, out.numel()).view_as(out)
    (out * weights).sum().backward()
    trainable = [(name, p) for name, p in model.head.named_parameters() if p.requires_grad]
    missing = [name for name, p in trainable if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing, f"head parameters without a finite gradient: {missing}"
    # Zero-initialised layers (GCNet's last conv) legitimately zero some gradients at init, but not all.
    if trainable:
        assert sum(p.grad.abs().sum() for _, p in trainable) > 0


def test_state_dict_round_trip(head_config: Path) -> None:
    model_a, setup = _build(head_config, seed=0)
    model_b, _ = _build(head_config, seed=123)
    model_b.load_state_dict(model_a.state_dict(), strict=True)
    model_a.eval(), model_b.eval()
    images = _images(setup, 2)
    with torch.no_grad():
        torch.testing.assert_close(model_a(images), model_b(images), atol=0, rtol=0)


def test_bf16_autocast_on_cpu(head_config: Path) -> None:
    model, setup = _build(head_config)
    model.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(_images(setup, 2))
    assert torch.isfinite(out.float()).all()
    assert out.shape == (2, model.out_dim)
