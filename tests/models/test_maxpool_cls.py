"""MaxPool-CLS: the max-pooled CLS in closed form, the attention layer against a hand-written
single-query attention, layer pooling as an equivalence, and a ViT backbone's per-level CLS."""

from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.nn.functional as F

import aggzoo
from aggzoo.models.backbones.timm_backbone import TimmBackbone
from aggzoo.models.features import Features
from aggzoo.models.heads.maxpool_cls import MaxPoolCLS
from aggzoo.models.vpr_model import VPRModel

C, N = 32, 6  # channels, a 2 x 3 patch map


def _features(levels: int, seed: int = 0) -> Features:
    gen = torch.Generator().manual_seed(seed)
    maps = tuple(torch.randn(2, C, 2, 3, generator=gen) for _ in range(levels))
    cls = tuple(torch.randn(2, C, generator=gen) for _ in range(levels))
    return Features(maps=maps, cls=cls[-1], cls_levels=cls)


def test_without_attention_it_is_the_elementwise_max_of_the_last_cls_tokens() -> None:
    feats = _features(4)
    head = MaxPoolCLS(C, num_layers=3, attend=False)
    expected = F.normalize(torch.maximum(torch.maximum(feats.cls_levels[1], feats.cls_levels[2]), feats.cls_levels[3]), dim=-1)
    torch.testing.assert_close(head(feats), expected, rtol=0, atol=0)
    assert not list(head.parameters())


def test_the_attention_layer_is_one_query_attention_of_the_cls_over_the_sequence() -> None:
    torch.manual_seed(0)
    feats = _features(1, seed=1)
    head = MaxPoolCLS(C, num_layers=1, num_heads=4).eval()
    attn = head.attention
    sequence = torch.cat([feats.cls[:, None], feats.last.flatten(2).transpose(1, 2)], dim=1)  # [B, 1 + n, C]
    w_q, w_k, w_v = attn.in_proj_weight.chunk(3)
    b_q, b_k, b_v = attn.in_proj_bias.chunk(3)
    heads, width = 4, C // 4
    q = (sequence[:, :1] @ w_q.T + b_q).view(2, 1, heads, width)
    k = (sequence @ w_k.T + b_k).view(2, 1 + N, heads, width)
    v = (sequence @ w_v.T + b_v).view(2, 1 + N, heads, width)
    weights = torch.einsum("bqhd,bkhd->bhqk", q, k).div(math.sqrt(width)).softmax(dim=-1)
    out = torch.einsum("bhqk,bkhd->bqhd", weights, v).reshape(2, C) @ attn.out_proj.weight.T + attn.out_proj.bias
    with torch.no_grad():
        torch.testing.assert_close(head(feats), F.normalize(out, dim=-1), atol=1e-5, rtol=0)


def test_pooling_layers_equals_attending_over_the_elementwise_max_sequence() -> None:
    torch.manual_seed(0)
    deep = MaxPoolCLS(C, num_layers=2, num_heads=4).eval()
    shallow = MaxPoolCLS(C, num_layers=1, num_heads=4).eval()
    shallow.load_state_dict(deep.state_dict())
    feats = _features(3, seed=2)
    pooled_map = torch.maximum(feats.maps[1], feats.maps[2])
    pooled_cls = torch.maximum(feats.cls_levels[1], feats.cls_levels[2])
    with torch.no_grad():
        torch.testing.assert_close(deep(feats), shallow(Features(maps=(pooled_map,), cls=pooled_cls, cls_levels=(pooled_cls,))))


def test_too_few_levels_are_refused_at_build_time_naming_the_backbone_setting() -> None:
    with pytest.raises(ValueError, match="no per-level CLS"):
        MaxPoolCLS(C)(Features(maps=(torch.randn(1, C, 2, 2),), cls=torch.randn(1, C)))
    with pytest.raises(ValueError, match=r"backbone.out_indices=\[-3, -2, -1\]"):
        VPRModel(TimmBackbone("test_vit", dynamic_img_size=True), functools.partial(MaxPoolCLS))


def test_a_vit_backbone_gives_the_cls_of_every_returned_block() -> None:
    vit = TimmBackbone("test_vit", out_indices=(-3, -2, -1), dynamic_img_size=True).eval()
    images = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        feats = vit(images)
        blocks = vit.model.forward_intermediates(images, indices=[3, 4, 5], return_prefix_tokens=True, norm=vit.final_norm,
                                                 intermediates_only=True)
    assert len(feats.cls_levels) == 3 and feats.cls is feats.cls_levels[-1]
    for got, (_, prefix) in zip(feats.cls_levels, blocks):
        torch.testing.assert_close(got, prefix[:, 0])


def test_the_zoo_entry_pools_the_last_three_dinov2_blocks() -> None:
    model = aggzoo.create_model("maxpool_cls_dinov2_vitb14", backbone_kwargs={"depth": 3, "img_size": 56, "frozen_stages": 0})
    assert model.out_dim == 768 and model.head.num_layers == 3 and len(model.backbone.out_indices) == 3
    with torch.no_grad():
        assert model(torch.randn(1, 3, 56, 56)).shape == (1, 768)
