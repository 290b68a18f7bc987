"""Closed-form checks of GeM, average pooling and NetVLAD."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from aggzoo.layers.pooling import gem
from aggzoo.models.features import Features
from aggzoo.models.heads.avgpool import AvgPool
from aggzoo.models.heads.gem import GeM
from aggzoo.models.heads.netvlad import NetVLAD, netvlad_alpha


def _positive_map(seed: int = 0) -> torch.Tensor:
    return torch.rand(2, 5, 3, 4, generator=torch.Generator().manual_seed(seed)) + 0.1


def test_gem_with_p1_is_the_mean_and_large_p_tends_to_max() -> None:
    x = _positive_map()
    torch.testing.assert_close(gem(x, 1.0), x.mean(dim=(2, 3)))
    torch.testing.assert_close(gem(x, 200.0), x.amax(dim=(2, 3)), rtol=0.02, atol=0)


def test_gem_closed_form_value() -> None:
    x = torch.tensor([1.0, 2.0, 3.0, 4.0]).view(1, 1, 2, 2)
    expected = ((1 + 8 + 27 + 64) / 4) ** (1 / 3)
    assert math.isclose(gem(x, 3.0).item(), expected, rel_tol=1e-6)


def test_gem_head_p1_equals_avgpool_head() -> None:
    x = _positive_map()
    head = GeM(5, p=1.0)
    torch.testing.assert_close(head(Features((x,))), AvgPool(5)(Features((x,))))


def test_gem_is_computed_in_fp32_under_half_inputs() -> None:
    x = torch.full((1, 2, 2, 2), 300.0, dtype=torch.float16)  # 300^3 overflows fp16
    out = gem(x, 3.0)
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), torch.full((1, 2), 300.0), rtol=1e-2, atol=0)


def test_gem_l2_placement_follows_the_dvgl_benchmark_choices() -> None:
    # --l2 before_pool: L2 over channels at each position, GeM, no final L2; none: GeM only.
    x = torch.rand(2, 5, 3, 4, generator=torch.Generator().manual_seed(3)) + 0.05
    unit = x / x.norm(dim=1, keepdim=True)
    manual_before = unit.pow(3).mean(dim=(2, 3)).pow(1 / 3)
    heads = {l2: GeM(5, l2=l2).eval() for l2 in ("after_pool", "before_pool", "none")}
    with torch.no_grad():
        out = {l2: head(Features(maps=(x,))) for l2, head in heads.items()}
    torch.testing.assert_close(out["before_pool"], manual_before, rtol=1e-5, atol=0)
    torch.testing.assert_close(out["none"], x.pow(3).mean(dim=(2, 3)).pow(1 / 3), rtol=1e-5, atol=0)
    torch.testing.assert_close(out["after_pool"], F.normalize(out["none"], dim=-1), rtol=1e-5, atol=0)
    assert (out["before_pool"].norm(dim=1) - 1).abs().min() > 1e-2  # no final L2: the rows are not unit vectors
    with pytest.raises(ValueError, match="before_pool"):
        GeM(5, l2="before")


def test_gem_whitening_is_delgs_fc_between_the_pooling_and_the_l2() -> None:
    # DELG's global head: GeM (p = 3 fixed) -> FC (with bias) -> L2.
    x = torch.rand(2, 5, 3, 4, generator=torch.Generator().manual_seed(4)) + 0.05
    torch.manual_seed(0)
    head = GeM(5, learn_p=False, whiten=7).eval()
    assert head.out_dim == 7 and set(head.state_dict()) == {"pool.p", "whiten.weight", "whiten.bias"}
    assert [n for n, p in head.named_parameters() if p.requires_grad] == ["whiten.weight", "whiten.bias"]
    pooled = x.pow(3).mean(dim=(2, 3)).pow(1 / 3)
    expected = F.normalize(pooled @ head.whiten.weight.T + head.whiten.bias, dim=-1)
    with torch.no_grad():
        torch.testing.assert_close(head(Features(maps=(x,))), expected, rtol=1e-5, atol=1e-6)
    assert set(GeM(5).state_dict()) == {"pool.p"}  # without whitening the keys are GeM's own


def test_netvlad_matches_a_direct_loop_and_is_k_major() -> None:
    torch.manual_seed(0)
    head = NetVLAD(6, num_clusters=3)
    x = torch.randn(2, 6, 3, 3)
    out = head(Features((x,)))
    # Reference: loop over clusters and positions.
    xn = F.normalize(x, dim=1).flatten(2)  # [B, C, N]
    logits = torch.einsum("kc,bcn->bkn", head.conv.weight[:, :, 0, 0], xn)
    a = logits.softmax(dim=1)
    ref = torch.zeros(2, 3, 6)
    for b in range(2):
        for k in range(3):
            for i in range(9):
                ref[b, k] += a[b, k, i] * (xn[b, :, i] - head.centroids[k])
    ref = F.normalize(F.normalize(ref, dim=2).reshape(2, -1), dim=1)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    # K-major: the first C coordinates belong to cluster 0 (normalised residual / sqrt(K)).
    block0 = out[:, :6] * math.sqrt(3)
    torch.testing.assert_close(block0.norm(dim=1), torch.ones(2), atol=1e-5, rtol=0)


def test_netvlad_init_sets_alpha_scaled_centroid_directions() -> None:
    gen = torch.Generator().manual_seed(1)
    centroids = torch.randn(4, 8, generator=gen)
    descriptors = F.normalize(centroids.repeat(25, 1) + 0.3 * torch.randn(100, 8, generator=gen), dim=1)
    head = NetVLAD(8, num_clusters=4)
    head.init_from_clusters(centroids, descriptors)
    alpha = netvlad_alpha(descriptors, centroids)
    torch.testing.assert_close(head.centroids.data, centroids)
    torch.testing.assert_close(head.conv.weight[:, :, 0, 0], alpha * F.normalize(centroids, dim=1))
    # alpha makes the mean top1-top2 logit gap exactly -ln(0.01).
    sims = descriptors @ F.normalize(centroids, dim=1).T
    top2 = sims.topk(2, dim=1).values
    assert math.isclose(alpha * (top2[:, 0] - top2[:, 1]).mean().item(), -math.log(0.01), rel_tol=1e-5)
    # Each descriptor is assigned mostly to the centroid it was drawn around.
    a = head.soft_assignment(descriptors.T.reshape(1, 8, 100, 1))[0]  # [K, N]
    assert (a.argmax(dim=0) == torch.arange(4).repeat(25)).float().mean() > 0.9
