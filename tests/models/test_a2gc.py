"""A^2GC: the asymmetric solver's marginals and closed forms, the geometric term, a float64 reference."""

from __future__ import annotations

import math

import pytest
import torch

from aggzoo.layers.sinkhorn import add_dustbin, dustbin_log_marginals
from aggzoo.models.features import Features
from aggzoo.models.heads.a2gc import A2GC, asymmetric_log_plan, coordinate_grid

C, M, L, G = 12, 4, 3, 5


def _scores(batch: int, clusters: int, features: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, clusters, features, generator=torch.Generator().manual_seed(seed)) * 2.0


def _plan(scores: torch.Tensor, dustbin: float, iters: int = 3) -> torch.Tensor:
    """Full rescaled plan [B, m+1, n] (dustbin row last)."""
    _, m, n = scores.shape
    log_a, log_b = dustbin_log_marginals(m, n)
    log_plan = asymmetric_log_plan(add_dustbin(scores, torch.tensor(dustbin)), log_a, log_b, iters)
    return (log_plan + math.log(n + m)).exp()


def test_columns_are_calibrated_exactly_rows_only_approximately() -> None:
    m, n = 6, 40
    plan = _plan(_scores(2, m, n), 1.0)
    # the last step calibrates the columns: each feature's mass is exactly 1
    torch.testing.assert_close(plan.sum(dim=1), torch.ones(2, n), atol=1e-5, rtol=0)
    # total mass is the shared total n of both marginals
    torch.testing.assert_close(plan.sum(dim=(1, 2)), torch.full((2,), float(n)), atol=1e-3, rtol=0)
    # asymmetric: the rows were calibrated before the columns, so for generic scores they drift off
    # their marginals (full Sinkhorn would bring them back)
    rows = plan.sum(dim=2)
    target = torch.cat([torch.ones(m), torch.tensor([float(n - m)])])
    assert (rows - target).abs().max() > 1e-2


def test_separable_scores_give_the_product_plan_for_any_iteration_count() -> None:
    # For Z_ki = r_k + c_i every averaged normalisation keeps Z separable, and the two calibrations
    # then give a_k b_i / mass: 1/n per cluster entry, (n - m)/n in the dustbin, whatever r, c.
    m, n = 5, 30
    gen = torch.Generator().manual_seed(1)
    r = torch.randn(1, m + 1, 1, generator=gen) * 3
    c = torch.randn(1, 1, n, generator=gen) * 3
    log_a, log_b = dustbin_log_marginals(m, n)
    for iters in (0, 1, 3, 7):
        plan = (asymmetric_log_plan(r + c, log_a, log_b, iters) + math.log(n + m)).exp()
        torch.testing.assert_close(plan[:, :m], torch.full((1, m, n), 1.0 / n), atol=1e-6, rtol=0)
        torch.testing.assert_close(plan[:, m], torch.full((1, n), (n - m) / n), atol=1e-6, rtol=0)


def test_plan_is_a_diagonal_scaling_of_the_gibbs_kernel() -> None:
    # Every step adds row and column terms only: log P - S_aug must be separable (alpha_k + beta_i).
    m, n = 4, 20
    scores = _scores(1, m, n, seed=3)
    log_a, log_b = dustbin_log_marginals(m, n)
    s_aug = add_dustbin(scores, torch.tensor(0.4))
    diff = (asymmetric_log_plan(s_aug, log_a, log_b, 3) - s_aug)[0].double()
    centred = diff - diff.mean(dim=0, keepdim=True) - diff.mean(dim=1, keepdim=True) + diff.mean()
    assert centred.abs().max() < 1e-4


def test_matches_a_probability_domain_reference_in_float64() -> None:
    # exp(Z - lse_rows/2 - lse_cols/2) = P / sqrt(rowsum_k colsum_i); then scale rows to a, columns to b.
    m, n = 4, 24
    scores = _scores(2, m, n, seed=4)
    p = torch.cat([scores, torch.full((2, 1, n), 0.8)], dim=1).double().exp()
    a = torch.cat([torch.ones(m), torch.tensor([n - m])]).double() / (n + m)
    b = torch.ones(n).double() / (n + m)
    for _ in range(3):
        p = p / (p.sum(dim=2, keepdim=True) * p.sum(dim=1, keepdim=True)).sqrt()
    p = p * (a / p.sum(dim=2))[:, :, None]
    p = p * (b / p.sum(dim=1))[:, None, :]
    torch.testing.assert_close(_plan(scores, 0.8).double(), p * (n + m), atol=1e-5, rtol=1e-5)


def test_coordinate_grid_is_x_then_y_in_minus_one_one() -> None:
    grid = coordinate_grid(3, 5)
    assert grid.shape == (1, 2, 3, 5)
    torch.testing.assert_close(grid[0, 0, 1], torch.linspace(-1, 1, 5))  # x varies along W
    torch.testing.assert_close(grid[0, 1, :, 2], torch.linspace(-1, 1, 3))  # y varies along H


def test_geometric_score_is_affine_in_the_position() -> None:
    # gamma_k . (W p + b) is affine in p, and the grid is symmetric about the centre, so a score and
    # the score of the point mirrored through the centre average to the centre's score.
    torch.manual_seed(0)
    head = A2GC(C, num_clusters=M, cluster_dim=L, token_dim=G)
    with torch.no_grad():
        head.cluster_geo.normal_()
        geo = head.geometric_scores(5, 7).view(M, 5, 7)
    mirrored = geo.flip(1, 2)
    torch.testing.assert_close((geo + mirrored) / 2, geo[:, 2:3, 3:4].expand(M, 5, 7), atol=1e-5, rtol=0)
    assert geo.std() > 0.1


def test_geometric_term_breaks_permutation_invariance_and_lambda_zero_restores_it() -> None:
    gen = torch.Generator().manual_seed(5)
    feats = Features(maps=(torch.randn(2, C, 6, 6, generator=gen),), cls=torch.randn(2, C, generator=gen))
    perm = torch.randperm(36, generator=gen)
    shuffled = Features(maps=(feats.last.flatten(2)[:, :, perm].view_as(feats.last),), cls=feats.cls)
    for geo_lambda, invariant in ((0.0, True), (5.0, False)):
        torch.manual_seed(0)
        head = A2GC(C, num_clusters=M, cluster_dim=L, token_dim=G, geo_lambda=geo_lambda).eval()
        with torch.no_grad():
            head.cluster_geo.normal_()
            same = torch.allclose(head(feats), head(shuffled), atol=1e-6)
        assert same == invariant


def test_upstream_keys_paper_size_and_errors() -> None:
    head = A2GC(768)
    assert head.out_dim == 8448
    keys = set(head.state_dict())
    assert {"geo_proj.weight", "geo_proj.bias", "cluster_geo", "dust_bin", "score.3.weight"} <= keys
    assert head.cluster_geo.shape == (64, 16) and head.geo_proj.weight.shape == (16, 2, 1, 1)
    with pytest.raises(ValueError, match=r"n=49 local features .* m=64 clusters"):
        head(Features(maps=(torch.randn(1, 768, 7, 7),), cls=torch.randn(1, 768)))
    with pytest.raises(ValueError, match="CLS token"):
        head(Features(maps=(torch.randn(1, 768, 9, 9),)))


def test_bf16_autocast_keeps_the_assignment_in_fp32() -> None:
    torch.manual_seed(0)
    head = A2GC(C, num_clusters=M, cluster_dim=L, token_dim=G).eval()
    scores = _scores(2, M, 30).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plan = head.assignment(scores, (5, 6))
    assert plan.dtype == torch.float32
    torch.testing.assert_close(plan, head.assignment(scores.float(), (5, 6)), atol=0, rtol=0)
