"""ConvAP: value equals a hand computation and the paper's conv-then-pool order, layout and size at the paper
configuration."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from aggzoo.models.features import Features
from aggzoo.models.heads.convap import ConvAP


def test_equals_hand_computation_channel_major() -> None:
    torch.manual_seed(0)
    head = ConvAP(6, out_channels=5, s1=2, s2=2)
    x = torch.randn(3, 6, 8, 6)
    w, b = head.channel_pool.weight[:, :, 0, 0], head.channel_pool.bias
    with torch.no_grad():
        out = head(Features((x,)))
        # 1x1 conv as a matrix product over channels, then the mean of each 4x3 quadrant.
        y = torch.einsum("dc,bchw->bdhw", w, x) + b[None, :, None, None]
        expected = torch.empty(3, 5, 2, 2)
        for i in range(2):
            for j in range(2):
                expected[:, :, i, j] = y[:, :, 4 * i : 4 * i + 4, 3 * j : 3 * j + 3].mean(dim=(2, 3))
        # flatten order: channel d outermost, then pooled row, then pooled column
        expected = F.normalize(expected.reshape(3, -1), dim=1)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)


def test_paper_configuration() -> None:
    head = ConvAP(2048, out_channels=1024)  # released ResNet-50 (layer4) model
    assert head.out_dim == 4096
    assert sum(p.numel() for p in head.parameters()) == 2048 * 1024 + 1024
    assert set(head.state_dict()) == {"channel_pool.weight", "channel_pool.bias"}
    with torch.no_grad():
        out = head(Features((torch.randn(2, 2048, 10, 10),)))
    assert out.shape == (2, 4096)
    assert ConvAP(2048).out_dim == 1024 * 2 * 2  # the constructor's default: the headline released d = 1024


@pytest.mark.parametrize("size", [(7, 5), (1, 1), (10, 10)])
def test_pooling_before_the_projection_gives_the_papers_conv_then_pool(size: tuple[int, int]) -> None:
    # Overlapping adaptive windows (7 x 5 -> 2 x 2) and a map smaller than the output included.
    torch.manual_seed(0)
    head = ConvAP(6, out_channels=5, s1=2, s2=2)
    x = torch.randn(3, 6, *size, requires_grad=True)
    probe = torch.randn(3, 20)
    out = head(Features((x,)))
    grads = torch.autograd.grad((out * probe).sum(), [x, head.channel_pool.weight])
    reference = F.normalize(F.adaptive_avg_pool2d(head.channel_pool(x), (2, 2)).flatten(1), dim=1)
    expected = torch.autograd.grad((reference * probe).sum(), [x, head.channel_pool.weight])
    torch.testing.assert_close(out, reference, atol=1e-6, rtol=1e-5)
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
