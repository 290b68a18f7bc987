"""Log-domain Sinkhorn with a dustbin: marginals, closed forms, invariances, fp32 under autocast."""

from __future__ import annotations

import pytest
import torch

from aggzoo.layers.sinkhorn import log_optimal_transport


def _scores(batch: int, clusters: int, features: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, clusters, features, generator=torch.Generator().manual_seed(seed)) * 2.0


def test_every_feature_column_sums_to_one_after_rescaling() -> None:
    scores = _scores(2, 6, 40)
    plan = log_optimal_transport(scores, torch.tensor(1.0), num_iters=3).exp()  # [B, m+1, n]
    torch.testing.assert_close(plan.sum(dim=1), torch.ones(2, 40), atol=1e-5, rtol=0)


def test_rows_reach_their_marginals_at_convergence() -> None:
    m, n = 6, 40
    plan = log_optimal_transport(_scores(2, m, n), torch.tensor(0.5), num_iters=300).exp()
    rows = plan.sum(dim=2)
    torch.testing.assert_close(rows[:, :m], torch.ones(2, m), atol=1e-4, rtol=0)  # each cluster: mass 1
    torch.testing.assert_close(rows[:, m], torch.full((2,), float(n - m)), atol=1e-3, rtol=0)  # dustbin: n - m
    # total mass n: every feature is fully assigned (clusters + dustbin)
    torch.testing.assert_close(plan.sum(dim=(1, 2)), torch.full((2,), float(n)), atol=1e-3, rtol=0)


def test_row_constant_scores_give_the_uniform_product_plan() -> None:
    # A kernel constant along each row is rank one, so Sinkhorn returns the product coupling
    # a b^T / mass: every feature gives 1/n to each cluster and (n - m)/n to the dustbin,
    # whatever the row constants and the dustbin score are.
    m, n = 5, 30
    row_values = torch.randn(3, m, 1, generator=torch.Generator().manual_seed(3)) * 4
    plan = log_optimal_transport(row_values.expand(3, m, n), torch.tensor(-2.7), num_iters=3).exp()
    torch.testing.assert_close(plan[:, :m], torch.full((3, m, n), 1.0 / n), atol=1e-6, rtol=0)
    torch.testing.assert_close(plan[:, m], torch.full((3, n), (n - m) / n), atol=1e-6, rtol=0)


def test_plan_is_invariant_to_per_row_shifts() -> None:
    # Adding r_k to row k of the augmented scores (dustbin included) is absorbed by the row
    # potential u at every iteration.
    m, n = 4, 25
    scores = _scores(1, m, n, seed=5)
    shifts = torch.randn(1, m + 1, 1, generator=torch.Generator().manual_seed(6)) * 3
    base = log_optimal_transport(scores, torch.tensor(1.0), num_iters=3)
    shifted = log_optimal_transport(scores + shifts[:, :m], torch.tensor(1.0) + shifts[0, m, 0], num_iters=3)
    torch.testing.assert_close(shifted, base, atol=1e-5, rtol=0)


def test_matches_probability_domain_matrix_scaling_in_float64() -> None:
    # Independent reference: plain Sinkhorn-Knopp on K = exp(S_aug / reg), alternating row and column scaling.
    m, n, reg, iters = 4, 20, 0.7, 3
    scores = _scores(2, m, n, seed=7)
    dustbin = torch.tensor(0.3)
    kernel = torch.cat([scores, dustbin.expand(2, 1, n)], dim=1).double().div(reg).exp()
    a = torch.cat([torch.ones(m), torch.tensor([n - m])]).double() / (n + m)
    b = torch.ones(n).double() / (n + m)
    plan = kernel.clone()
    for _ in range(iters):
        plan = plan * (a / plan.sum(dim=2))[:, :, None]
        plan = plan * (b / plan.sum(dim=1))[:, None, :]
    expected = plan * (n + m)
    got = log_optimal_transport(scores, dustbin, num_iters=iters, reg=reg).exp().double()
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n", [16, 15])
def test_too_few_local_features_raise_a_clear_error(n: int) -> None:
    with pytest.raises(ValueError, match=rf"n={n} local features .* m=16 clusters.*larger input.*fewer clusters"):
        log_optimal_transport(_scores(1, 16, n), torch.tensor(1.0))


def test_bf16_autocast_keeps_the_solver_in_fp32() -> None:
    scores = _scores(2, 8, 50).bfloat16()
    dustbin = torch.tensor(1.0, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        log_plan = log_optimal_transport(scores, dustbin)
    assert log_plan.dtype == torch.float32
    # The same bf16 inputs solved outside autocast in fp32 give the same plan: nothing was
    # rounded to bf16 inside the iterations.
    torch.testing.assert_close(log_plan, log_optimal_transport(scores.float(), dustbin.detach()), atol=0, rtol=0)
    log_plan.exp()[:, :-1].sum().backward()
    assert dustbin.grad is not None and torch.isfinite(dustbin.grad)
