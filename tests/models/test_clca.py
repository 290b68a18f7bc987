"""CLCA head: the aggregation against a closed-form computation (BN in eval mode from its running
statistics, the depthwise convolution as an explicit per-channel weighted sum over layers, GELU by
erf), the IFA variant (k = 0) likewise, which levels it reads, and the zoo entry's layer choice."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import aggzoo
from aggzoo.models.features import Features
from aggzoo.models.heads.clca import CLCA

D, L, K = 8, 4, 2


def _features(levels: int, seed: int = 0) -> Features:
    gen = torch.Generator().manual_seed(seed)
    cls = tuple(torch.randn(3, D, generator=gen) for _ in range(levels))
    maps = tuple(torch.randn(3, D, 2, 2, generator=gen) for _ in range(levels))
    return Features(maps=maps, cls=cls[-1], cls_levels=cls)


def _randomise(head: CLCA, seed: int = 1) -> CLCA:
    """Non-trivial running statistics and affine parameters, so eval-mode BN is not the identity."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in head.modules():
            if isinstance(module, (torch.nn.BatchNorm1d, torch.nn.LayerNorm)):
                module.weight.copy_(torch.randn(module.weight.shape, generator=gen))
                module.bias.copy_(torch.randn(module.bias.shape, generator=gen))
            if isinstance(module, torch.nn.BatchNorm1d):
                module.running_mean.copy_(torch.randn(module.running_mean.shape, generator=gen))
                module.running_var.copy_(torch.rand(module.running_var.shape, generator=gen) + 0.5)
    return head.eval()


def _bn(x: torch.Tensor, bn: torch.nn.BatchNorm1d) -> torch.Tensor:
    """x [B, C] or [B, C, L]; eval BN: (x - mean) / sqrt(var + eps) * w + b per channel."""
    shape = (1, -1) + (1,) * (x.dim() - 2)
    return (x - bn.running_mean.view(shape)) / torch.sqrt(bn.running_var.view(shape) + bn.eps) * bn.weight.view(shape) + bn.bias.view(shape)


def _gelu(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def test_depthwise_aggregation_is_a_per_channel_weighted_sum_over_layers() -> None:
    torch.manual_seed(0)
    head = _randomise(CLCA(D, num_layers=L, kernels_per_layer=K, out_dim=5))
    feats = _features(L)
    bn0, conv, bn1 = head.aggregate[0], head.aggregate[1], head.aggregate[2]
    x = _bn(torch.stack(feats.cls_levels, dim=-1), bn0)  # [B, D, L]
    w = conv.weight[:, 0, :]  # [kD, L]: output j reads input channel j // k
    z = torch.stack([(x[:, j // K, :] * w[j]).sum(-1) + conv.bias[j] for j in range(K * D)], dim=1)  # [B, kD]
    z = _gelu(_bn(z, bn1))
    expected = F.normalize(z @ head.proj.weight[:, :, 0].T + head.proj.bias, dim=-1)
    with torch.no_grad():
        got = head(feats)
    assert got.shape == (3, 5) and head.out_dim == 5
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


def test_without_projection_the_descriptor_is_the_normalised_kd_features() -> None:
    torch.manual_seed(0)
    projected = _randomise(CLCA(D, num_layers=L, out_dim=6))
    plain = CLCA(D, num_layers=L, project=False).eval()
    plain.load_state_dict({k: v for k, v in projected.state_dict().items() if not k.startswith("proj.")})
    feats = _features(L, seed=2)
    with torch.no_grad():
        z = plain.aggregate(torch.stack(feats.cls_levels, dim=-1))[:, :, 0]
        assert plain.out_dim == K * D
        torch.testing.assert_close(plain(feats), F.normalize(z, dim=-1), rtol=0, atol=0)
        torch.testing.assert_close(projected(feats), F.normalize(projected.proj(z[:, :, None])[:, :, 0], dim=-1))


def test_ifa_variant_mixes_layers_with_one_linear_then_relu_layernorm_linear() -> None:
    torch.manual_seed(0)
    head = _randomise(CLCA(D, num_layers=L, kernels_per_layer=0, out_dim=5))
    mix, norm = head.aggregate[0], head.aggregate[3]
    feats = _features(L, seed=3)
    x = torch.stack(feats.cls_levels, dim=-1)
    h = torch.relu(sum(mix.weight[0, i] * x[:, :, i] for i in range(L)) + mix.bias[0])  # [B, D]
    h = (h - h.mean(-1, keepdim=True)) / torch.sqrt(h.var(-1, unbiased=False, keepdim=True) + norm.eps) * norm.weight + norm.bias
    expected = F.normalize(h @ head.proj.weight.T + head.proj.bias, dim=-1)
    with torch.no_grad():
        torch.testing.assert_close(head(feats), expected, atol=1e-6, rtol=0)


def test_it_reads_the_last_levels_in_depth_order() -> None:
    torch.manual_seed(0)
    head = _randomise(CLCA(D, num_layers=L))
    feats = _features(L + 2, seed=4)
    earlier = tuple(torch.randn_like(c) for c in feats.cls_levels[:2]) + feats.cls_levels[2:]
    swapped = feats.cls_levels[:2] + feats.cls_levels[2:][::-1]
    with torch.no_grad():
        out = head(feats)
        torch.testing.assert_close(head(Features(maps=feats.maps, cls_levels=earlier)), out, rtol=0, atol=0)
        assert not torch.allclose(head(Features(maps=feats.maps, cls_levels=swapped)), out, atol=1e-3)
    with pytest.raises(ValueError, match="no per-level CLS"):
        head(Features(maps=feats.maps, cls=feats.cls))
    with pytest.raises(ValueError, match="3 levels"):
        head(Features(maps=feats.maps[:3], cls_levels=feats.cls_levels[:3]))


def test_the_zoo_entry_reads_blocks_3_6_9_11_without_the_final_norm() -> None:
    model = aggzoo.create_model("clca_dinov2_vitb14", backbone_kwargs={"embed_dim": 32, "num_heads": 2, "img_size": 56,
                                                                        "frozen_stages": 0}).eval()
    assert model.backbone.out_indices == (3, 6, 9, 11) and model.backbone.final_norm is False
    assert model.head.num_layers == 4 and model.out_dim == 32
    with torch.no_grad():
        images = torch.randn(2, 3, 56, 56, generator=torch.Generator().manual_seed(5))
        blocks = model.backbone.model.forward_intermediates(images, indices=[3, 6, 9, 11], return_prefix_tokens=True,
                                                            norm=False, intermediates_only=True)
        expected = model.head(Features(maps=tuple(m for m, _ in blocks), cls_levels=tuple(p[:, 0] for _, p in blocks)))
        torch.testing.assert_close(model(images), expected)
