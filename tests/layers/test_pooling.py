"""GeM pooling: the closed form, a fixed exponent that follows the state_dict it is loaded from, and
SuperGlobal's regional GeM against a brute-force window loop and the authors' LP-pool form."""

from __future__ import annotations

import pytest
import torch

from aggzoo.layers.pooling import GeMPool, regional_gem


def _maps() -> torch.Tensor:
    return torch.rand(2, 3, 4, 5, generator=torch.Generator().manual_seed(0)) + 0.1


def test_gem_is_the_generalised_mean_for_learned_and_fixed_exponents() -> None:
    x = _maps()
    expected = x.pow(3.0).mean(dim=(2, 3)).pow(1 / 3.0)
    for learn_p in (True, False):
        torch.testing.assert_close(GeMPool(p=3.0, learn_p=learn_p)(x), expected, rtol=1e-6, atol=0)


def test_a_fixed_exponent_is_re_read_when_a_state_dict_is_loaded() -> None:
    x = _maps()
    pool = GeMPool(p=4.6, learn_p=False)
    pool.load_state_dict({"p": torch.tensor([2.0])})
    torch.testing.assert_close(pool(x), x.pow(2.0).mean(dim=(2, 3)).sqrt(), rtol=1e-6, atol=0)


def test_a_fixed_exponent_gets_no_gradient_and_the_input_does() -> None:
    x = _maps().requires_grad_(True)
    pool = GeMPool(p=4.6, learn_p=False)
    pool(x).sum().backward()
    assert pool.p.grad is None and x.grad is not None and torch.isfinite(x.grad).all()


def _reflect(i: int, n: int) -> int:
    # numpy/torch "reflect" padding: ... 2 1 | 0 1 2 ... n-1 | n-2 n-3 ...
    return -i if i < 0 else (2 * (n - 1) - i if i >= n else i)


def test_regional_gem_is_half_the_input_plus_half_the_windowed_power_mean() -> None:
    x = _maps()  # [2, 3, 4, 5]
    p, size = 2.5, 3
    expected = torch.empty_like(x)
    height, width = x.shape[-2:]
    for i in range(height):
        for j in range(width):
            window = x[..., [_reflect(i + di, height) for di in (-1, 0, 1)], :][..., [_reflect(j + dj, width) for dj in (-1, 0, 1)]]
            expected[..., i, j] = 0.5 * x[..., i, j] + 0.5 * window.pow(p).mean(dim=(-2, -1)).pow(1 / p)
    torch.testing.assert_close(regional_gem(x, p, size), expected, rtol=1e-5, atol=0)


def test_regional_gem_equals_the_authors_lp_pool_form_on_non_negative_maps() -> None:
    # SuperGlobal's rgem: 0.5 * LPPool2d(p, 5, stride 1)(ReflectionPad2d(2)(x / 25^(1/p))) + 0.5 * x
    x = torch.rand(2, 4, 7, 9, generator=torch.Generator().manual_seed(2))
    lp = torch.nn.LPPool2d(2.5, 5, stride=1)(torch.nn.ReflectionPad2d(2)(x / 25 ** (1 / 2.5)))
    torch.testing.assert_close(regional_gem(x), 0.5 * lp + 0.5 * x, rtol=1e-5, atol=1e-7)


def test_regional_gem_refuses_maps_too_small_to_pad() -> None:
    with pytest.raises(ValueError, match="at least 3x3"):
        regional_gem(torch.rand(1, 2, 2, 8))
