"""Local window operators of TLC against brute-force window loops and torch's pooling."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from aggzoo.layers.local_pool import LocalAvgPool2d, LocalMaxPool2d, LocalSoftmaxPool2d, local_max, local_mean


def _window_starts(size: int, k: int) -> list[int]:
    """Start of the k-long window for each output index: centred, clamped inside [0, size)."""
    return [min(max(i - (k - 1) // 2, 0), size - k) for i in range(size)]


def _brute(x: torch.Tensor, k: tuple[int, int], reduce) -> torch.Tensor:
    h, w = x.shape[-2:]
    out = torch.empty_like(x)
    for i, si in enumerate(_window_starts(h, k[0])):
        for j, sj in enumerate(_window_starts(w, k[1])):
            out[..., i, j] = reduce(x[..., si : si + k[0], sj : sj + k[1]])
    return out


@pytest.mark.parametrize("size,kernel", [((12, 12), (6, 6)), ((11, 14), (4, 7)), ((9, 8), (1, 1)), ((10, 10), (10, 3))])
def test_local_mean_equals_brute_force_and_avg_pool2d(size: tuple[int, int], kernel: tuple[int, int]) -> None:
    x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(0)) * 5 + 40  # large mean
    got = local_mean(x, kernel)
    expected = _brute(x, kernel, lambda win: win.mean(dim=(-2, -1)))
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-5)
    # The same thing spelled with torch's pooling: stride-1 valid windows, output replicate-padded.
    valid = F.avg_pool2d(x, kernel, stride=1)
    dh, dw = size[0] - valid.shape[-2], size[1] - valid.shape[-1]
    padded = F.pad(valid, (dw // 2, dw - dw // 2, dh // 2, dh - dh // 2), mode="replicate")
    torch.testing.assert_close(got, padded, atol=1e-4, rtol=1e-5)


def test_local_max_equals_brute_force() -> None:
    x = torch.randn(2, 3, 11, 13, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(local_max(x, (4, 5)), _brute(x, (4, 5), lambda win: win.amax(dim=(-2, -1))))


def test_local_softmax_pool_equals_brute_force() -> None:
    gen = torch.Generator().manual_seed(2)
    x, logits = torch.randn(2, 3, 9, 10, generator=gen), 3 * torch.randn(2, 1, 9, 10, generator=gen)
    pool = LocalSoftmaxPool2d((4, 6))

    def brute(si: int, sj: int) -> torch.Tensor:
        weights = logits[:, :, si : si + 4, sj : sj + 6].flatten(2).softmax(-1)  # [B, 1, 24]
        return (x[:, :, si : si + 4, sj : sj + 6].flatten(2) * weights).sum(-1)

    expected = torch.empty_like(x)
    for i, si in enumerate(_window_starts(9, 4)):
        for j, sj in enumerate(_window_starts(10, 6)):
            expected[..., i, j] = brute(si, sj)
    torch.testing.assert_close(pool(x, logits), expected, atol=1e-5, rtol=1e-5)


def test_window_covering_the_map_is_the_global_op() -> None:
    x = torch.randn(2, 3, 5, 7, generator=torch.Generator().manual_seed(3))
    logits = torch.randn(2, 1, 5, 7)
    torch.testing.assert_close(LocalAvgPool2d((5, 9))(x), F.adaptive_avg_pool2d(x, 1))
    torch.testing.assert_close(LocalMaxPool2d((8, 7))(x), F.adaptive_max_pool2d(x, 1))
    softmax = logits.flatten(2).softmax(-1)
    expected = (x.flatten(2) * softmax).sum(-1)[..., None, None]
    torch.testing.assert_close(LocalSoftmaxPool2d((5, 7))(x, logits), expected)


def test_local_mean_is_fp32_under_bf16_autocast() -> None:
    x = (torch.randn(1, 4, 40, 40, generator=torch.Generator().manual_seed(4)) + 3).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = local_mean(x, (12, 12))
    assert got.dtype == torch.float32
    expected = F.avg_pool2d(x.float(), 12, stride=1)
    torch.testing.assert_close(got[..., 5:-6, 5:-6], expected, atol=1e-5, rtol=1e-6)


def test_uncalibrated_window_says_how_to_set_it() -> None:
    with pytest.raises(RuntimeError, match="convert_tlc"):
        LocalAvgPool2d()(torch.zeros(1, 1, 4, 4))
