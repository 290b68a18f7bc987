"""DINOv3 backbones (timm ``vit_*_patch16_dinov3``, class ``Eva``: patch 16, 2-D RoPE, CLS + 4 storage
tokens) on tiny random models of the same structure (no DINOv3 weights are reachable here).

Independent expectations: timm's own ``forward_features`` (the map and CLS the wrapper returns), timm's
own prefix-token mechanism (ImAge's inserted tokens must be treated as Eva treats its class/storage
tokens), the closed form of LoPA at initialisation; then every head that reads ViT tokens runs on it.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from aggzoo.models.backbones.aggregation_tokens import AggregationTokenViT
from aggzoo.models.backbones.lopa import LoPAViT
from aggzoo.models.backbones.multiconv_adapter import MultiConvAdapterViT
from aggzoo.models.backbones.sela_adapter import SelaAdapterViT
from aggzoo.models.backbones.timm_backbone import TimmBackbone
from aggzoo.models.vpr_model import VPRModel

CONF = Path(__file__).resolve().parents[2] / "conf"
# The structure of vit_small_patch16_dinov3 (RoPE, 4 storage tokens, layer scale, SwiGLU-free MLP), shrunk.
TINY = {"embed_dim": 64, "depth": 2, "num_heads": 2, "dynamic_img_size": True}
NAME = "vit_small_patch16_dinov3"
SIZE = (128, 160)  # 8 x 10 patches: more than SALAD's 64 clusters
PREFIX = 5  # CLS + 4 storage tokens


def _images(batch: int = 2, size: tuple[int, int] = SIZE) -> torch.Tensor:
    return torch.randn(batch, 3, *size, generator=torch.Generator().manual_seed(1))


def _grid(size: tuple[int, int]) -> tuple[int, int]:
    return size[0] // 16, size[1] // 16


@pytest.mark.parametrize("yaml_name", ["dinov3_vits16", "dinov3_vitb16", "dinov3_vitl16"])
def test_backbone_configs_name_dinov3_models(yaml_name: str) -> None:
    cfg = OmegaConf.load(CONF / "backbone" / f"{yaml_name}.yaml")
    with torch.device("meta"):
        backbone = instantiate(cfg, pretrained=False, depth=1, frozen_stages=0)
    model = backbone.model
    assert type(model).__name__ == "Eva" and model.num_prefix_tokens == PREFIX and model.pos_embed is None
    assert model.rope is not None and model.patch_embed.patch_size == (16, 16)


def test_patch_map_and_cls_are_timms_tokens_without_the_storage_tokens() -> None:
    torch.manual_seed(0)
    backbone = TimmBackbone(NAME, **TINY).eval()
    images = _images(size=(64, 96))
    with torch.no_grad():
        features = backbone(images)
        tokens = backbone.model.forward_features(images)  # [B, 5 + n, C], after the final norm
    rows, cols = _grid((64, 96))
    expected = tokens[:, PREFIX:].reshape(2, rows, cols, 64).permute(0, 3, 1, 2)
    torch.testing.assert_close(features.last, expected)
    torch.testing.assert_close(features.cls, tokens[:, 0])


def test_block_loop_with_rope_equals_timms_forward() -> None:
    # AggregationTokenViT runs the blocks itself; without tokens it must be the plain model.
    torch.manual_seed(0)
    backbone = AggregationTokenViT(NAME, num_tokens=3, insert_before_block=1, **TINY).eval()
    images = _images()
    with torch.no_grad():
        tokens = backbone.model.forward_features(images)
        loop = backbone.data_init_features(images)
    rows, cols = _grid(SIZE)
    torch.testing.assert_close(loop, tokens[:, PREFIX:].reshape(2, rows, cols, 64).permute(0, 3, 1, 2))
    assert backbone.rotary_embedding(SIZE).shape == (rows * cols, 64)  # sin | cos of head_dim 32


def test_inserted_tokens_are_unrotated_like_the_prefix_tokens() -> None:
    torch.manual_seed(0)
    count, start = 3, 1
    backbone = AggregationTokenViT(NAME, num_tokens=count, insert_before_block=start, **TINY).eval()
    with torch.no_grad():
        backbone.aggregation_tokens.normal_()
    images = _images()
    vit = backbone.model
    with torch.no_grad():
        out = backbone(images)
        # Reference: timm's own mechanism, the attention told that count more tokens are prefix tokens.
        rope = vit.rope.get_embed(shape=_grid(SIZE))
        x, _ = vit._pos_embed(vit.patch_embed(images))
        for block in vit.blocks[:start]:
            x = block(x, rope=rope)
        x = torch.cat([backbone.aggregation_tokens.expand(2, -1, -1), x], dim=1)
        for block in vit.blocks[start:]:
            block.attn.num_prefix_tokens += count
            try:
                x = block(x, rope=rope)
            finally:
                block.attn.num_prefix_tokens -= count
        x = vit.norm(x)
    torch.testing.assert_close(out.tokens, x[:, :count])
    torch.testing.assert_close(out.cls, x[:, count])
    rows, cols = _grid(SIZE)
    torch.testing.assert_close(out.last, x[:, count + PREFIX:].reshape(2, rows, cols, 64).permute(0, 3, 1, 2))


def test_lopa_at_initialisation_is_the_normalised_sum_of_every_blocks_tokens() -> None:
    # fc2 = 0: y_L = x_0 + x_1 + ... + x_L (lopa.py docstring), then the final norm.
    torch.manual_seed(0)
    backbone = LoPAViT(NAME, **TINY).eval()
    images = _images()
    vit = backbone.model
    with torch.no_grad():
        x0, _ = vit._pos_embed(vit.patch_embed(images))
        _, blocks = vit.forward_intermediates(images, indices=list(range(2)), output_fmt="NLC",
                                              return_prefix_tokens=True)
        total = x0 + sum(torch.cat([prefix, patches], dim=1) for patches, prefix in blocks)
        expected = vit.norm(total)
        features = backbone(images)
    rows, cols = _grid(SIZE)
    torch.testing.assert_close(features.last, expected[:, PREFIX:].reshape(2, rows, cols, 64).permute(0, 3, 1, 2))
    torch.testing.assert_close(features.cls, expected[:, 0])


# Every head that reads ViT tokens, with the backbone class it is used with; widths shrunk for speed.
TOKEN_HEADS = {
    "salad": (TimmBackbone, {}), "salad544": (TimmBackbone, {}),
    "megaloc": (TimmBackbone, {"cluster_dim": 32, "feat_dim": 256}),
    "boq_dinov2": (TimmBackbone, {"proj_channels": 64, "num_queries": 8}),
    "qaa": (TimmBackbone, {}), "a2gc": (TimmBackbone, {}),
    "edtformer": (LoPAViT, {}), "image": (AggregationTokenViT, {}),
    "supervlad": (TimmBackbone, {}), "supervladcross": (TimmBackbone, {"encoder_ffn_dim": 64}),
    "supervlad1": (TimmBackbone, {}),
    "cricavpr": (MultiConvAdapterViT, {"encoder_ffn_dim": 64}),
    "selavpr": (SelaAdapterViT, {"local_hidden": 16, "local_dim": 8}),
}


@functools.cache
def _head_factory(name: str) -> tuple[type[TimmBackbone], functools.partial]:
    cls, faster = TOKEN_HEADS[name]
    cfg = OmegaConf.merge(OmegaConf.load(CONF / "head" / f"{name}.yaml"), faster)
    return cls, instantiate(cfg)


@pytest.mark.parametrize("name", sorted(TOKEN_HEADS))
def test_token_heads_run_on_a_tiny_dinov3(name: str) -> None:
    cls, factory = _head_factory(name)
    kwargs = dict(TINY)
    if cls is AggregationTokenViT:
        kwargs.update(num_tokens=factory.keywords.get("num_tokens", 8), insert_before_block=1)
    torch.manual_seed(0)
    model = VPRModel(cls(NAME, **kwargs), factory).train()
    out = model(_images(2))
    assert out.shape == (2, model.out_dim) and torch.isfinite(out).all()
    torch.testing.assert_close(out.norm(dim=1), torch.ones(2), atol=1e-4, rtol=0)
    out.sum().backward()
    trained = [p for p in model.parameters() if p.requires_grad]
    assert trained and all(p.grad is not None for p in trained)
