"""GSP: mu = 1 is average pooling, the weights solve the partial transport constraint, closed forms, the
authors' Lipschitz normalisation in the cost, and the prototypes' greedy k-center initialisation."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from aggzoo.models.features import Features
from aggzoo.models.heads.gsp import GSP, greedy_k_center, lipschitz_normalize, partial_transport_weights

C, D, K = 32, 16, 8


def _features(seed: int = 0, size: int = 6) -> Features:
    return Features(maps=(torch.randn(2, C, size, size, generator=torch.Generator().manual_seed(seed)),))


def _head(**kwargs: object) -> GSP:
    torch.manual_seed(0)
    return GSP(C, embedding_dim=D, num_prototypes=K, **kwargs).eval()


def _average_pooling(head: GSP, feats: Features) -> torch.Tensor:
    return F.normalize(head.feature_transform(feats.last).mean(dim=(2, 3)), dim=-1)


def test_transport_ratio_one_is_average_pooling_then_l2() -> None:
    head = _head(transport_ratio=1.0)
    feats = _features()
    with torch.no_grad():
        torch.testing.assert_close(head(feats), _average_pooling(head, feats), atol=1e-6, rtol=0)


def test_average_pooling_is_the_limit_of_the_general_solver() -> None:
    # the mu = 1 case is not a separate method: mu -> 1 tends to it through the fixed point
    head, feats = _head(transport_ratio=0.999), _features()
    with torch.no_grad():
        gap = (head(feats) - _average_pooling(head, feats)).abs().max()
        far = (_head(transport_ratio=0.3)(feats) - _average_pooling(head, feats)).abs().max()
    assert gap < 5e-3 < far


def _bisection_weights(log_mass: torch.Tensor, mu: float) -> torch.Tensor:
    """Independent solve in float64: find lambda with mean_i lambda s_i / (1 + lambda s_i) = mu."""
    s = log_mass.double().exp()
    lo = torch.full((s.shape[0], 1), -60.0, dtype=torch.float64)
    hi = torch.full((s.shape[0], 1), 60.0, dtype=torch.float64)
    for _ in range(200):
        mid = (lo + hi) / 2
        lam = mid.exp()
        too_much = (lam * s / (1 + lam * s)).mean(dim=1, keepdim=True) > mu
        hi = torch.where(too_much, mid, hi)
        lo = torch.where(too_much, lo, mid)
    lam = lo.exp()
    rho = (1.0 / s.shape[1]) / (1 + lam * s)  # residual mass of each feature
    return (1 - s.shape[1] * rho) / mu  # w_i = (1 - n rho_i) / mu


@pytest.mark.parametrize("mu", [0.1, 0.3, 0.7])
def test_weights_match_an_independent_bisection_solve(mu: float) -> None:
    log_mass = torch.randn(3, 50, generator=torch.Generator().manual_seed(1)) * 2 - 4
    got = partial_transport_weights(log_mass, mu, num_iters=100).double()
    torch.testing.assert_close(got, _bisection_weights(log_mass, mu), atol=1e-4, rtol=1e-4)
    # transported mass is mu: the weights average to one
    torch.testing.assert_close(got.mean(dim=1), torch.ones(3, dtype=torch.float64), atol=1e-5, rtol=0)


def test_gradient_is_the_implicit_gradient_of_the_converged_solution() -> None:
    # Reference: autograd through 3000 unrolled float64 fixed-point steps (converged, so its
    # gradient is the implicit one); ours differentiates a single Newton step at the solution.
    mu = 0.3
    log_mass = (torch.randn(2, 25, generator=torch.Generator().manual_seed(8)) * 2 - 4).requires_grad_()
    probe = torch.randn(2, 25, generator=torch.Generator().manual_seed(9))
    (partial_transport_weights(log_mass, mu, num_iters=100) * probe).sum().backward()
    ref_mass = log_mass.detach().double().requires_grad_()
    log_lambda = torch.zeros(2, 1, dtype=torch.float64)
    for _ in range(3000):
        log_lambda = log_lambda + math.log(mu) - torch.sigmoid(log_lambda + ref_mass).mean(dim=1, keepdim=True).log()
    (torch.sigmoid(log_lambda + ref_mass) / mu * probe.double()).sum().backward()
    torch.testing.assert_close(log_mass.grad.double(), ref_mass.grad, atol=1e-4, rtol=1e-3)


def test_equal_affinities_give_uniform_weights_for_any_ratio() -> None:
    for mu in (0.05, 0.3, 0.9):
        w = partial_transport_weights(torch.full((2, 20), -1.7), mu, num_iters=100)
        torch.testing.assert_close(w, torch.ones(2, 20), atol=1e-5, rtol=0)


def test_features_closer_to_the_prototypes_weigh_more() -> None:
    log_mass = torch.linspace(-6, 0, 30).unsqueeze(0)
    w = partial_transport_weights(log_mass, 0.3, num_iters=100)[0]
    assert (w.diff() > 0).all()
    assert w.max() <= 1 / 0.3 + 1e-6  # a feature can at most be fully transported


def test_descriptor_is_a_convex_reweighting_of_the_embedded_features() -> None:
    head, feats = _head(), _features(seed=2)
    with torch.no_grad():
        z = head.feature_transform(feats.last).flatten(2)
        w = head.pooling_weights(z)
        expected = F.normalize((z * w[:, None, :]).mean(dim=2), dim=-1)
        torch.testing.assert_close(head(feats), expected, atol=1e-6, rtol=0)
    assert (w >= 0).all()


def test_permuting_the_features_does_not_change_the_descriptor() -> None:
    head, feats = _head(), _features(seed=3)
    perm = torch.randperm(36, generator=torch.Generator().manual_seed(4))
    shuffled = feats.last.flatten(2)[:, :, perm].view_as(feats.last)
    with torch.no_grad():
        torch.testing.assert_close(head(Features(maps=(shuffled,))), head(feats), atol=1e-6, rtol=0)


def test_bad_ratio_is_rejected_and_paper_size() -> None:
    with pytest.raises(ValueError, match=r"transport_ratio \(mu\) must be in \(0, 1\]"):
        GSP(C, transport_ratio=0.0)
    head = GSP(768)
    assert head.out_dim == 512 and head.prototypes.shape == (64, 512)
    assert math.isclose(head.entropy_weight, 5.0) and head.num_iters == 100


def test_greedy_k_center_picks_farthest_points_lowest_index_on_ties() -> None:
    line = torch.arange(11.0)[:, None]  # the points 0, 1, ..., 10 on a line
    # First pick: point 0 (no seeds); then 10 (farthest from 0); then 5; then 2, 3, 7 and 8 are all at
    # squared distance 4 from a pick, and the lowest index wins.
    assert greedy_k_center(line, 4).flatten().tolist() == [0.0, 10.0, 5.0, 2.0]
    # A seed at 0 is not returned, but the picks keep away from it.
    assert greedy_k_center(line, 3, seeds=torch.zeros(1, 1)).flatten().tolist() == [10.0, 5.0, 2.0]
    with pytest.raises(ValueError, match="cannot pick 12 of 11"):
        greedy_k_center(line, 12)


@pytest.mark.parametrize("seed", range(5))
def test_greedy_k_center_covers_within_twice_the_optimal_radius(seed: int) -> None:
    # Gonzalez (1985): the greedy picks cover every point within twice the best possible radius,
    # found here by trying every set of k points.
    points = torch.randn(10, 2, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    k = 3

    def radius(centres: torch.Tensor) -> float:
        return torch.cdist(points, centres).amin(dim=1).max().item()

    best = min(radius(points[list(subset)]) for subset in itertools.combinations(range(10), k))
    assert radius(greedy_k_center(points, k).double()) <= 2 * best + 1e-9


def test_prototypes_from_pooled_embeddings_seeded_by_the_first_k() -> None:
    head = _head()
    embeddings = F.normalize(torch.randn(3 * K, D, generator=torch.Generator().manual_seed(3)), dim=-1)
    head.init_from_pooled(embeddings)
    torch.testing.assert_close(head.prototypes, greedy_k_center(embeddings[K:], K, seeds=embeddings[:K]))
    # Fewer than 2K images: all are candidates, nothing seeds; fewer than K: a clear error.
    head.init_from_pooled(embeddings[: K + 2])
    torch.testing.assert_close(head.prototypes, greedy_k_center(embeddings[: K + 2], K))
    with pytest.raises(ValueError, match=f"at least {K} images"):
        head.init_from_pooled(embeddings[: K - 1])
    feats = _features()
    # the memory entries are N-normalised averages (they keep their length where it is below one)
    average = head.feature_transform(feats.last).mean(dim=(2, 3))
    torch.testing.assert_close(head.pooled_embedding(feats), average / average.norm(dim=1, keepdim=True).clamp_min(1))


def test_lipschitz_normalisation_keeps_short_vectors_and_projects_long_ones() -> None:
    x = torch.tensor([[0.3, 0.4], [3.0, 4.0], [0.0, 0.0]])
    torch.testing.assert_close(lipschitz_normalize(x), torch.tensor([[0.3, 0.4], [0.6, 0.8], [0.0, 0.0]]))


def test_lipschitz_normalisation_has_the_authors_gradient() -> None:
    # Their custom backward: dx = (dy - (m * x_hat . dy) m * x_hat) / s, m = [|x| > 1], s = max(|x|, 1).
    x = torch.tensor([[0.3, -0.2, 0.1], [2.0, -1.0, 3.0]], dtype=torch.float64, requires_grad=True)
    dy = torch.tensor([[1.0, 2.0, -1.0], [0.5, -2.0, 1.5]], dtype=torch.float64)
    lipschitz_normalize(x).backward(dy)
    norm = x.detach().norm(dim=1, keepdim=True)
    mask = (norm > 1).double()
    scale = mask * norm + (1 - mask)
    x_hat = mask * x.detach() / scale
    expected = (dy - (x_hat * dy).sum(dim=1, keepdim=True) * x_hat) / scale
    torch.testing.assert_close(x.grad, expected)


def test_the_cost_is_the_distance_of_lipschitz_normalised_features_and_prototypes() -> None:
    # Features and prototypes of norms on both sides of 1, where N differs from F.normalize.
    head = _head()
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        head.prototypes.copy_(torch.randn(K, D, generator=generator) * torch.linspace(0.2, 2.0, K)[:, None] / D**0.5)
        z = torch.randn(2, D, 36, generator=generator) * torch.linspace(0.1, 3.0, 36) / D**0.5
        cost = torch.cdist(lipschitz_normalize(head.prototypes), lipschitz_normalize(z.transpose(1, 2)).contiguous())
        expected = partial_transport_weights(torch.logsumexp(-head.entropy_weight * cost, dim=1), head.transport_ratio,
                                             head.num_iters)
        torch.testing.assert_close(head.pooling_weights(z), expected, atol=1e-5, rtol=0)
        unit = torch.cdist(F.normalize(head.prototypes, dim=-1), F.normalize(z.transpose(1, 2), dim=-1).contiguous())
        with_unit = partial_transport_weights(torch.logsumexp(-head.entropy_weight * unit, dim=1), head.transport_ratio,
                                              head.num_iters)
        assert (head.pooling_weights(z) - with_unit).abs().max() > 1e-2  # the two normalisations do differ here


def _authors_lipschitz_grad(x: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """The authors' backward written out (pytorch/gsp/norm_layer.py): the norm enters only where |x| > 1."""
    norm = x.norm(dim=-1, keepdim=True)
    projected = norm > 1
    x_hat = torch.where(projected, x / norm, torch.zeros_like(x))
    divisor = torch.where(projected, norm, torch.ones_like(norm))
    return (dy - (x_hat * dy).sum(dim=-1, keepdim=True) * x_hat) / divisor


def test_at_norm_exactly_one_the_gradient_is_the_identity_as_the_authors() -> None:
    # rows of norm exactly 1 in floating point (0.5^2 * 4 = 1, a basis vector), one above, one below
    x = torch.tensor([[0.5, 0.5, 0.5, 0.5], [0.0, 1.0, 0.0, 0.0], [1.0, 2.0, -2.0, 0.5], [0.1, 0.2, 0.0, -0.3]],
                     dtype=torch.float64, requires_grad=True)
    assert torch.equal(x.detach()[:2].norm(dim=1), torch.ones(2, dtype=torch.float64))
    dy = torch.tensor([[1.0, -2.0, 0.5, 3.0], [0.7, 1.5, -1.0, 2.0], [0.5, -2.0, 1.5, 1.0], [1.0, 1.0, 1.0, 1.0]],
                      dtype=torch.float64)
    lipschitz_normalize(x).backward(dy)
    torch.testing.assert_close(x.grad, _authors_lipschitz_grad(x.detach(), dy))
    torch.testing.assert_close(x.grad[:2], dy[:2])  # at |x| = 1: no projection term (clamp_min(1) would add one)


def test_prototype_gradient_at_unit_norm_follows_the_authors_rule() -> None:
    # Prototypes of norm exactly 1: the authors' N is the identity there, value and Jacobian, so the head's
    # gradient equals that of the same cost built from the raw prototypes (no normalisation at all).
    head = _head()
    rows = torch.zeros(K, D, dtype=torch.float32)
    for k in range(K):
        rows[k, (2 * k) % D] = 1.0 if k % 2 else -1.0  # signed basis vectors: norm exactly 1
        rows[k] = rows[k].roll(k // 4)
    with torch.no_grad():
        head.prototypes.copy_(rows)
    assert torch.equal(head.prototypes.detach().norm(dim=1), torch.ones(K))
    z = torch.randn(2, D, 36, generator=torch.Generator().manual_seed(3)) * torch.linspace(0.1, 3.0, 36) / D**0.5
    weights_for = torch.linspace(-1.0, 1.0, 36)
    (head.pooling_weights(z) * weights_for).sum().backward()
    ours = head.prototypes.grad.clone()

    protos = rows.clone().requires_grad_(True)
    z_hat = lipschitz_normalize(z.transpose(1, 2))  # features: not what is tested here
    cost = torch.cdist(protos.expand(2, -1, -1), z_hat)  # [B, K, n]
    reference = partial_transport_weights(torch.logsumexp(-head.entropy_weight * cost, dim=1), head.transport_ratio,
                                          head.num_iters)
    (reference * weights_for).sum().backward()
    torch.testing.assert_close(ours, protos.grad, atol=1e-5, rtol=1e-4)
    assert protos.grad.abs().max() > 1e-3  # a gradient that is there to compare
