"""The head contract, checked for every ``conf/head/*.yaml`` on a tiny timm backbone.

A new head is tested here the moment its YAML exists: output shape = ``out_dim``, unit norm,
batch size 1, finite values, a gradient for every trainable parameter, identical outputs after a
state-dict round trip, bf16 autocast on CPU without NaN, and its declarations (``Head.needs_cls``,
``needs_tokens``, ``min_levels``, ``required_map_size``, ``min_positions``, ``data_init``,
``no_weight_decay()``, ``lr_multipliers()``) hold.

The backbone and image size come from those declarations, never from a list of head names:
``test_vit`` for a head that reads the CLS token (its class attention too: ``ClassAttentionViT``), ``test_vit`` with inserted aggregation tokens for
one that reads tokens, ``test_resnet`` with several ``out_indices`` for a multi-level head and cut
after its stride-16 stage otherwise; the image is sized for the head's fixed map size or its
minimum number of local features.
"""

from __future__ import annotations

import fnmatch
import functools
import inspect
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from aggzoo.models.backbones.aggregation_tokens import AggregationTokenViT
from aggzoo.models.backbones.class_attention import ClassAttentionViT
from aggzoo.models.backbones.timm_backbone import TimmBackbone
from aggzoo.models.data_init import DATA_INIT_METHODS, DataInitDeclaring
from aggzoo.models.features import Features
from aggzoo.models.heads.base import Head
from aggzoo.models.vpr_model import VPRModel, build_head

HEAD_CONFIGS = sorted((Path(__file__).resolve().parents[2] / "conf" / "head").glob("*.yaml"))

#: Speed only, never needed for a head to be tested: the paper configuration's Linear(16640 -> 8448)
#: is 140M parameters, so keep the structure and shrink the widths.
FASTER: dict[str, dict[str, Any]] = {"megaloc": {"cluster_dim": 32, "feat_dim": 512}}

MIN_SIDE = 128  # pixels: 8 x 8 maps at stride 16


@dataclass(frozen=True)
class Setup:
    backbone_cls: type[TimmBackbone]
    backbone: str
    backbone_kwargs: dict[str, Any]
    image_size: tuple[int, int]


def head_partial(config_path: Path) -> functools.partial:
    cfg = OmegaConf.merge(OmegaConf.load(config_path), FASTER.get(config_path.stem, {}))
    return instantiate(cfg)


def _backbone_for(head_cls: type[Head]) -> tuple[type[TimmBackbone], str, dict[str, Any]]:
    if head_cls.needs_cls_attention:
        return ClassAttentionViT, "test_vit", {"dynamic_img_size": True}
    if head_cls.needs_tokens:
        return AggregationTokenViT, "test_vit", {"insert_before_block": 4, "dynamic_img_size": True}
    if head_cls.needs_cls:  # a multi-level ViT head reads the deepest blocks
        levels = {"out_indices": tuple(range(-head_cls.min_levels, 0))} if head_cls.min_levels > 1 else {}
        return TimmBackbone, "test_vit", {"dynamic_img_size": True, **levels}
    if head_cls.min_levels > 1:
        levels = max(head_cls.min_levels, 3)  # test_resnet has 5 levels; fuse the deepest ones
        return TimmBackbone, "test_resnet", {"out_indices": tuple(range(5 - levels, 5)), "frozen_stages": 0}
    return TimmBackbone, "test_resnet", {"out_indices": (3,)}


def setup_for(config_path: Path) -> Setup:
    """The tiny backbone and image size this head declares it needs."""
    factory = head_partial(config_path)
    backbone_cls, name, kwargs = _backbone_for(factory.func)
    plain = TimmBackbone(name, **{k: v for k, v in kwargs.items() if k != "insert_before_block"})
    probe = build_head(factory, plain)  # instance declarations depend on the constructor arguments
    if probe.needs_tokens:
        kwargs = {**kwargs, "num_tokens": probe.required_tokens}
    stride = plain.feature_info[-1]["reduction"]
    if probe.required_map_size is not None:
        height, width = probe.required_map_size
        size = (height * stride, width * stride)
    else:
        side = max(MIN_SIDE, math.ceil(math.sqrt(probe.min_positions)) * stride)
        size = (side, side)
    return Setup(backbone_cls, name, kwargs, size)


def _build(config_path: Path, seed: int = 0) -> tuple[VPRModel, Setup]:
    setup = setup_for(config_path)
    torch.manual_seed(seed)
    backbone = setup.backbone_cls(setup.backbone, **setup.backbone_kwargs)
    return VPRModel(backbone, head_partial(config_path)), setup


def _images(setup: Setup, batch: int, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 3, *setup.image_size, generator=gen)


@pytest.fixture(params=HEAD_CONFIGS, ids=[p.stem for p in HEAD_CONFIGS])
def head_config(request: pytest.FixtureRequest) -> Path:
    return request.param


def test_every_config_targets_its_constructor_keys(head_config: Path) -> None:
    cfg = OmegaConf.to_container(OmegaConf.load(head_config))
    assert cfg.get("_partial_") is True, "heads are completed with in_channels at build time"
    target = instantiate({"_target_": "hydra.utils.get_class", "path": cfg["_target_"]})
    assert issubclass(target, Head)
    params = inspect.signature(target.__init__).parameters
    for key in cfg:
        if not key.startswith("_"):
            assert key in params, f"{head_config.name}: key {key!r} is not a constructor argument of {target}"
    # preflight tells the user to set these, so they must be constructor arguments too
    assert all(name in params for name in target.map_size_args or ())


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


# -- the declarations hold -------------------------------------------------------------------------


def test_declared_parameters_exist(head_config: Path) -> None:
    """``no_weight_decay()`` / ``lr_multipliers()`` name trainable parameters of the head."""
    model, _ = _build(head_config)
    head = model.head
    names = [n for n, p in head.named_parameters() if p.requires_grad]
    for pattern in (*head.no_weight_decay(), *head.lr_multipliers()):
        assert any(fnmatch.fnmatch(n, pattern) for n in names), f"{pattern!r} names no trainable parameter of {head}"
    assert all(m > 0 for m in head.lr_multipliers().values())


def test_declared_data_init_is_implemented_and_runs(head_config: Path) -> None:
    model, setup = _build(head_config)
    for module in [m for m in model.modules() if isinstance(m, DataInitDeclaring)]:
        kind = module.data_init
        assert kind in DATA_INIT_METHODS
        for method in DATA_INIT_METHODS[kind]:
            assert getattr(type(module), method) is not getattr(DataInitDeclaring, method), \
                f"{type(module).__name__} declares data_init={kind!r} but does not implement {method}"
        gen = torch.Generator().manual_seed(0)
        if kind == "kmeans":
            descriptors = torch.nn.functional.normalize(torch.randn(256, model.backbone.out_channels, generator=gen))
            module.init_from_clusters(descriptors[: module.kmeans_clusters], descriptors)
        elif kind == "pooled":
            with torch.no_grad():
                dim = module.pooled_embedding(model.backbone(_images(setup, 1))).shape[-1]
            module.init_from_pooled(torch.nn.functional.normalize(torch.randn(512, dim, generator=gen)))
    model.eval()
    with torch.no_grad():
        assert torch.isfinite(model(_images(setup, 2))).all()


def test_a_head_refuses_what_it_does_not_declare_to_need(head_config: Path) -> None:
    """Without its CLS token / tokens, or at another map size, a head raises a ValueError (which
    preflight reports); a head that does not declare the CLS token runs without it."""
    model, setup = _build(head_config)
    head = model.head.eval()
    with torch.no_grad():
        features = model.backbone.eval()(_images(setup, 1))
        if head.needs_cls or head.needs_tokens:
            with pytest.raises(ValueError):
                head(Features(maps=features.maps))
        else:
            head(Features(maps=features.maps, tokens=features.tokens))
        if head.required_map_size is not None:
            h, w = head.required_map_size
            smaller = tuple(torch.nn.functional.avg_pool2d(m, 2) for m in features.maps)
            with pytest.raises(ValueError, match=f"{h}x{w}"):
                head(Features(maps=smaller, cls=features.cls, tokens=features.tokens))


def test_a_multi_level_head_refuses_a_single_level(head_config: Path) -> None:
    factory = head_partial(head_config)
    if factory.func.min_levels < 2:
        pytest.skip("single-level head")
    with pytest.raises(ValueError):
        build_head(factory, TimmBackbone("test_resnet", out_indices=(3,)))


def test_every_attribute_can_be_read(head_config: Path) -> None:
    """``torch.jit.trace`` reads every attribute of every module (``dir``): a declaration must not raise."""
    model, _ = _build(head_config)
    for module in (model.head, model.backbone):
        for name in dir(module):
            getattr(module, name)
