"""GeM pooling: the closed form, and a fixed exponent that follows the state_dict it is loaded from."""

from __future__ import annotations

import torch

from aggzoo.layers.pooling import GeMPool


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
