"""GNP: the learned-norm pooling's closed forms (mean, RMS, max, sum), per-channel orders, gradients."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from aggzoo.models.features import Features
from aggzoo.models.heads.avgpool import AvgPool
from aggzoo.models.heads.gnp import GNP, learned_norm_pool


def _map(seed: int = 0, shape: tuple[int, ...] = (2, 3, 4, 5)) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("order", [1.0, 2.0, 3.7])
def test_pool_is_the_normalised_lp_norm(order: float) -> None:
    x = _map().double()
    expected = x.abs().pow(order).mean(dim=(2, 3)).pow(1 / order)
    got = learned_norm_pool(x, torch.full((3,), order, dtype=torch.float64))
    torch.testing.assert_close(got, expected.to(got.dtype), rtol=1e-6, atol=1e-7)


def test_order_one_is_mean_and_sum_and_two_is_rms() -> None:
    x = _map().abs()
    one, two = torch.ones(3), torch.full((3,), 2.0)
    torch.testing.assert_close(learned_norm_pool(x, one), x.mean(dim=(2, 3)))
    torch.testing.assert_close(learned_norm_pool(x, one, normalized=False), x.sum(dim=(2, 3)))
    torch.testing.assert_close(learned_norm_pool(x, two), x.square().mean(dim=(2, 3)).sqrt())


def test_large_orders_tend_to_max_without_overflow_in_half() -> None:
    x = _map() * 300.0  # 300^200 overflows any float format without the max factored out
    got = learned_norm_pool(x.half(), torch.full((3,), 200.0))
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.float(), x.abs().amax(dim=(2, 3)), rtol=0.03, atol=0)


def test_each_channel_has_its_own_order() -> None:
    x = _map(shape=(2, 1, 4, 5)).abs().repeat(1, 3, 1, 1)  # the same positions in every channel
    orders = torch.tensor([1.0, 2.0, 50.0])
    got = learned_norm_pool(x, orders)
    for c, order in enumerate(orders.tolist()):
        torch.testing.assert_close(got[:, c], learned_norm_pool(x[:, c:c + 1], torch.tensor([order]))[:, 0])
    # power means grow with the order, from the mean to (almost) the max
    assert (got[:, 0] < got[:, 1]).all() and (got[:, 1] < got[:, 2]).all() and (got[:, 2] <= x.amax(dim=(2, 3))[:, 0]).all()


def test_head_starts_at_its_initial_order_and_learns_it() -> None:
    head = GNP(3, p=2.5)
    torch.testing.assert_close(head.p, torch.full((3,), 2.5))
    out = head(Features((_map(),)))
    assert out.shape == (2, 3)
    torch.testing.assert_close(out.norm(dim=1), torch.ones(2))
    out.sum().backward()
    assert head.rho.grad is not None and head.rho.grad.abs().sum() > 0
    assert not GNP(3, learn_p=False).rho.requires_grad


def test_head_near_order_one_is_average_pooling_of_positive_maps() -> None:
    x = _map().abs() + 0.1
    head = GNP(3, p=1.0 + 1e-6)
    torch.testing.assert_close(head(Features((x,))), AvgPool(3)(Features((x,))), rtol=1e-4, atol=1e-5)


def test_orders_stay_above_one() -> None:
    head = GNP(4)
    with torch.no_grad():
        head.rho.copy_(torch.tensor([-30.0, -1.0, 0.0, 5.0]))
    assert (head.p >= 1.0).all() and math.isclose(head.p[2].item(), 1 + math.log(2), rel_tol=1e-6)
    with pytest.raises(ValueError, match="must be > 1"):
        GNP(4, p=1.0)


def test_descriptor_is_l2_of_the_pooled_map() -> None:
    x = _map()
    head = GNP(3)
    torch.testing.assert_close(head(Features((x,))), F.normalize(learned_norm_pool(x, head.p), dim=-1))
