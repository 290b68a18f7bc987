"""AFA attention, compositing, GCNet block and class-attention pooling: closed forms and invariances."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from aggzoo.layers.attention import (
    ChannelAttention,
    ChannelLayerNorm,
    ClassAttentionPool,
    GlobalContextBlock,
    SoftmaxPool2d,
    SpatialAttention,
    composite_weights,
)


@pytest.mark.parametrize("levels", [2, 3, 4])
def test_composite_weights_closed_form(levels: int) -> None:
    gen = torch.Generator().manual_seed(levels)
    s = [torch.rand(2, 1, 3, 3, generator=gen) for _ in range(levels)]
    weights = composite_weights(s)
    for i in range(levels):
        expected = s[i].clone()
        for j in range(i + 1, levels):
            expected = expected * (1 - s[j])
        torch.testing.assert_close(weights[i], expected)
    # Telescoping sum: sum_i a_i = 1 - prod_j (1 - s_j) <= 1.
    total = torch.stack(weights).sum(0)
    torch.testing.assert_close(total, 1 - torch.stack([1 - t for t in s]).prod(0))
    assert (total <= 1).all()


def test_composite_weights_last_level_opaque_hides_the_rest() -> None:
    s = [torch.full((1, 1, 2, 2), 0.7), torch.full((1, 1, 2, 2), 0.3), torch.ones(1, 1, 2, 2)]
    weights = composite_weights(s)
    assert torch.equal(weights[2], torch.ones(1, 1, 2, 2))
    assert torch.equal(weights[0], torch.zeros(1, 1, 2, 2)) and torch.equal(weights[1], torch.zeros(1, 1, 2, 2))


def test_spatial_attention_is_a_probability_map() -> None:
    sa = SpatialAttention(8, hidden=4).eval()
    s = sa(torch.randn(2, 8, 5, 6))
    assert s.shape == (2, 1, 5, 6) and ((s > 0) & (s < 1)).all()


def test_channel_attention_is_global_and_permutation_invariant() -> None:
    torch.manual_seed(0)
    ca = ChannelAttention(32, reduction=16)
    assert ca.mlp[0].out_channels == 2  # C / r
    x = torch.randn(2, 32, 5, 6)
    c = ca(x)
    assert c.shape == (2, 32, 1, 1) and ((c > 0) & (c < 1)).all()
    perm = torch.randperm(30)
    shuffled = x.flatten(2)[..., perm].view_as(x)
    torch.testing.assert_close(ca(shuffled), c)
    # sigmoid(MLP(avg) + MLP(max)) with the module's own MLP, written out.
    mlp = lambda v: ca.mlp(v[..., None, None])  # noqa: E731
    torch.testing.assert_close(c, torch.sigmoid(mlp(x.mean((2, 3))) + mlp(x.amax((2, 3)))))


def test_softmax_pool_limits() -> None:
    x = torch.randn(2, 4, 3, 5)
    # Constant logits: the plain average.
    torch.testing.assert_close(SoftmaxPool2d()(x, torch.zeros(2, 1, 3, 5)), x.mean((2, 3), keepdim=True))
    # One dominant logit: that position's feature.
    logits = torch.zeros(2, 1, 3, 5)
    logits[:, :, 1, 3] = 100.0
    torch.testing.assert_close(SoftmaxPool2d()(x, logits), x[:, :, 1:2, 3:4])


def test_gc_block_is_identity_at_init_and_adds_one_vector_per_image() -> None:
    torch.manual_seed(0)
    block = GlobalContextBlock(32)
    assert block.channel_add_conv[0].out_channels == 2  # C / 16
    x = torch.randn(2, 32, 6, 7)
    assert torch.equal(block(x), x)
    nn.init.normal_(block.channel_add_conv[3].weight)
    delta = block(x) - x
    # Channel-add fusion: the same context vector at every position, different per image.
    torch.testing.assert_close(delta, delta[:, :, :1, :1].expand_as(delta))
    assert not torch.allclose(delta[0, :, 0, 0], delta[1, :, 0, 0])


def test_channel_layer_norm_matches_upstream_layer_norm_on_a_context_vector() -> None:
    norm = ChannelLayerNorm(6)
    nn.init.normal_(norm.weight), nn.init.normal_(norm.bias)
    upstream = nn.LayerNorm([6, 1, 1])
    upstream.load_state_dict(norm.state_dict())
    v = torch.randn(3, 6, 1, 1)
    torch.testing.assert_close(norm(v), upstream(v))


def test_class_attention_pool_matches_its_formula() -> None:
    torch.manual_seed(0)
    dim, n = 16, 10
    pool = ClassAttentionPool(dim, init_scale=1.0)
    x = torch.randn(2, n, dim)
    # Written out from the paper with the module's weights: u = LN1([cls; x]); the CLS query.
    cls = pool.cls_token.expand(2, 1, dim)
    u = pool.norm1(torch.cat((cls, x), dim=1))
    q, k, v = pool.attn.q(u[:, :1]), pool.attn.k(u), pool.attn.v(u)
    attn = (q @ k.transpose(1, 2) / math.sqrt(dim)).softmax(-1)
    cls = cls + pool.gamma_1 * pool.attn.proj(attn @ v)
    hidden = F.gelu(pool.mlp.fc1(pool.norm2(cls)))
    assert hidden.shape[-1] == 3 * dim  # MLP ratio 3
    cls = cls + pool.gamma_2 * pool.mlp.fc2(hidden)
    torch.testing.assert_close(pool(x), pool.norm(cls[:, 0]), atol=1e-5, rtol=1e-5)


def test_class_attention_pool_ignores_patch_order_and_starts_near_the_query() -> None:
    torch.manual_seed(0)
    pool = ClassAttentionPool(16, init_scale=1.0)
    x = torch.randn(2, 12, 16)
    torch.testing.assert_close(pool(x[:, torch.randperm(12)]), pool(x), atol=1e-5, rtol=1e-5)
    fresh = ClassAttentionPool(16)  # layer scale 1e-6: the output barely depends on the input
    assert torch.equal(fresh.gamma_1, torch.full((16,), 1e-6))
    torch.testing.assert_close(fresh(x), fresh.norm(fresh.cls_token[:, 0]).expand(2, 16), atol=1e-4, rtol=0)
