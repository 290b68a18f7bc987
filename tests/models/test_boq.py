"""BoQ: official key names, channel-major layout, batch independence, attention maps, paper sizes."""

from __future__ import annotations

import pytest
import torch

from aggzoo.models.features import Features
from aggzoo.models.heads.boq import BoQ

# The module tree of the original src/boq.py: Conv3x3, LayerNorm, L blocks each holding a
# torch TransformerEncoderLayer, the queries, two MultiheadAttention and two LayerNorm, then fc.
_ENCODER_KEYS = [
    "self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight", "self_attn.out_proj.bias",
    "linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias",
    "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias",
]
_ATTN_KEYS = ["in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"]


def _official_keys(num_layers: int) -> set[str]:
    keys = {"proj_c.weight", "proj_c.bias", "norm_input.weight", "norm_input.bias", "fc.weight", "fc.bias"}
    for i in range(num_layers):
        keys |= {f"boqs.{i}.encoder.{k}" for k in _ENCODER_KEYS}
        keys |= {f"boqs.{i}.{attn}.{k}" for attn in ("self_attn", "cross_attn") for k in _ATTN_KEYS}
        keys |= {f"boqs.{i}.{norm}.{k}" for norm in ("norm_q", "norm_out") for k in ("weight", "bias")}
        keys.add(f"boqs.{i}.queries")
    return keys


def test_state_dict_keys_are_the_official_ones() -> None:
    assert set(BoQ(32, proj_channels=64, num_queries=4, row_dim=2).state_dict()) == _official_keys(2)


def test_layout_is_channel_major() -> None:
    """With fc selecting query r of block 0 for output row r, descriptor entry (c, r) is channel c
    of block 0's r-th query output, read before the final normalisation."""
    torch.manual_seed(0)
    p, q, r = 64, 5, 3
    head = BoQ(8, proj_channels=p, num_queries=q, num_layers=2, row_dim=r).eval()
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.bias.zero_()
        for row in range(r):
            head.fc.weight[row, row] = 1.0
    captured = {}
    head.boqs[0].norm_out.register_forward_hook(lambda _m, _i, out: captured.setdefault("o", out))
    with torch.no_grad():
        out = head(Features((torch.randn(2, 8, 4, 5),)))
    block0 = captured["o"]  # [B, Q, p]
    expected = block0[:, :r, :].transpose(1, 2).reshape(2, p * r)  # [B, p, R] flattened p-major
    expected = expected / expected.norm(dim=1, keepdim=True)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)


def test_query_set_is_residual_then_norm() -> None:
    """With the query self-attention's output projection zeroed, its branch adds nothing and the
    query set is exactly LayerNorm(queries)."""
    torch.manual_seed(0)
    block = BoQ(8, proj_channels=64, num_queries=4, row_dim=2).boqs[0]
    with torch.no_grad():
        block.self_attn.out_proj.weight.zero_()
        block.self_attn.out_proj.bias.zero_()
        expected = torch.nn.functional.layer_norm(block.queries, (64,), block.norm_q.weight, block.norm_q.bias)
        torch.testing.assert_close(block.query_set(), expected)


def test_each_image_is_independent_of_the_batch() -> None:
    torch.manual_seed(0)
    head = BoQ(8, proj_channels=64, num_queries=4, row_dim=2).eval()
    x = torch.randn(3, 8, 4, 4)
    with torch.no_grad():
        together = head(Features((x,)))
        alone = torch.cat([head(Features((x[i : i + 1],))) for i in range(3)])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)


def test_attention_maps_are_distributions_over_positions() -> None:
    torch.manual_seed(0)
    head = BoQ(8, proj_channels=64, num_queries=4, num_layers=3, row_dim=2).eval()
    maps = head.attention_maps(Features((torch.randn(2, 8, 3, 5),)))
    assert len(maps) == 3
    for attn in maps:
        assert attn.shape == (2, 4, 15)
        torch.testing.assert_close(attn.sum(-1), torch.ones(2, 4))


def test_proj_channels_must_be_a_multiple_of_64() -> None:
    with pytest.raises(ValueError, match="multiple of 64"):
        BoQ(8, proj_channels=100)


@pytest.mark.parametrize(
    ("in_channels", "proj_channels", "size", "out_dim", "num_params"),
    [
        (1024, 512, 20, 16384, 15_301_152),  # ResNet-50 layer3 at 320x320
        (768, 384, 16, 12288, 8_626_080),  # DINOv2 ViT-B/14 at 224x224
    ],
)
def test_paper_configurations(in_channels: int, proj_channels: int, size: int, out_dim: int, num_params: int) -> None:
    head = BoQ(in_channels, proj_channels=proj_channels).eval()
    # Parameter count from the architecture: conv3x3, input LN, 2 blocks, fc over 2*64 queries.
    p = proj_channels
    encoder = (3 * p * p + 3 * p) + (p * p + p) + (p * 4 * p + 4 * p) + (4 * p * p + p) + 4 * p
    block = encoder + 64 * p + 2 * (4 * p * p + 4 * p) + 4 * p
    expected = (in_channels * p * 9 + p) + 2 * p + 2 * block + (128 * 32 + 32)
    assert expected == num_params  # also what the authors' BoQ module counts at this configuration
    assert sum(t.numel() for t in head.parameters()) == num_params
    with torch.no_grad():
        out = head(Features((torch.randn(2, in_channels, size, size),)))
    assert out.shape == (2, out_dim) == (2, head.out_dim)
