"""MixVPR: fixed-size check, channel-major layout, the projections' order, mixer init, paper configuration."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from aggzoo.models.features import Features
from aggzoo.models.heads.mixvpr import MixVPR


def test_wrong_map_size_names_the_size_it_needs() -> None:
    head = MixVPR(32, out_channels=16, mix_depth=1)
    with pytest.raises(ValueError) as err:
        head(Features((torch.randn(1, 32, 14, 14),)))
    message = str(err.value)
    assert "20x20 feature maps" in message
    assert "320x320 images on a stride-16" in message
    assert "280x280 images on a stride-14" in message
    assert "got 14x14" in message
    assert "in_h=14, in_w=14" in message


def test_wrong_channels_rejected() -> None:
    head = MixVPR(32, in_h=4, in_w=4, out_channels=16, mix_depth=1)
    with pytest.raises(ValueError, match="32-channel"):
        head(Features((torch.randn(1, 16, 4, 4),)))


def test_layout_is_channel_major() -> None:
    """With every mixer's last layer zeroed (each mixer is then the identity), the descriptor is
    ``L2(vec_d-major(W_c X W_r^T + biases))``."""
    torch.manual_seed(0)
    c, h, w, d, r = 6, 3, 4, 5, 2
    head = MixVPR(c, in_h=h, in_w=w, out_channels=d, mix_depth=2, out_rows=r)
    with torch.no_grad():
        for mixer in head.mix:
            mixer.mix[3].weight.zero_()
            mixer.mix[3].bias.zero_()
    x = torch.randn(2, c, h, w)
    with torch.no_grad():
        out = head(Features((x,)))
        wc, bc = head.channel_proj.weight, head.channel_proj.bias  # [d, c], [d]
        wr, br = head.row_proj.weight, head.row_proj.bias  # [r, n], [r]
        xn = x.reshape(2, c, h * w)
        y = torch.einsum("dc,bcn,rn->bdr", wc, xn, wr) + bc[None, :, None] * wr.sum(1)[None, None, :] + br
        expected = F.normalize(y.reshape(2, d * r), dim=1)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)


def test_row_projection_first_gives_the_papers_order_values_and_gradients() -> None:
    torch.manual_seed(0)
    head = MixVPR(6, in_h=3, in_w=4, out_channels=5, mix_depth=2, out_rows=2)
    for p in head.parameters():  # non-zero biases everywhere
        torch.nn.init.normal_(p, std=0.3)
    x = torch.randn(2, 6, 3, 4, requires_grad=True)
    probe = torch.randn(2, 10)

    def papers_order(x: torch.Tensor) -> torch.Tensor:  # channel projection on all n columns, then rows
        mixed = head.mix(x.flatten(2))
        return F.normalize(head.row_proj(head.channel_proj(mixed.transpose(1, 2)).transpose(1, 2)).flatten(1), dim=1)

    params = [x, *head.parameters()]
    out, reference = head(Features((x,))), papers_order(x)
    torch.testing.assert_close(out, reference, atol=1e-6, rtol=1e-5)
    got = torch.autograd.grad((out * probe).sum(), params)
    want = torch.autograd.grad((reference * probe).sum(), params)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-5)


def test_mixer_init_is_small_normal_with_zero_bias() -> None:
    torch.manual_seed(0)
    head = MixVPR(8)
    for mixer in head.mix:
        for layer in (mixer.mix[1], mixer.mix[3]):
            assert abs(layer.weight.std().item() - 0.02) < 0.002
            assert torch.equal(layer.bias, torch.zeros_like(layer.bias))


def test_paper_configuration() -> None:
    head = MixVPR(1024)  # ResNet-50 layer3, 320x320 images
    n = 400
    expected_params = 4 * (2 * n + 2 * (n * n + n)) + (1024 * 1024 + 1024) + (n * 4 + 4)
    assert sum(p.numel() for p in head.parameters()) == expected_params
    keys = set(head.state_dict())
    assert {"mix.0.mix.0.weight", "mix.3.mix.1.weight", "mix.3.mix.3.bias", "channel_proj.weight", "row_proj.bias"} <= keys
    with torch.no_grad():
        out = head(Features((torch.randn(2, 1024, 20, 20),)))
    assert out.shape == (2, 4096) == (2, head.out_dim)
