"""QAA: l-major layout, permutation invariance, per-image independence, upstream names, and the authors' score
normalisation (optimal transport with a dustbin) against a Sinkhorn written here from SALAD's formula."""

from __future__ import annotations

import math

import pytest
import torch

from aggzoo.models.features import Features
from aggzoo.models.heads.qaa import QAA

C, M, L, NQ = 32, 4, 8, 10


def _head() -> QAA:
    torch.manual_seed(0)
    return QAA(C, num_clusters=M, cluster_dim=L, num_queries=NQ, feature_heads=2, score_heads=4).eval()


def _features(batch: int = 2, seed: int = 0) -> Features:
    return Features(maps=(torch.randn(batch, C, 5, 6, generator=torch.Generator().manual_seed(seed)),))


def test_clusters_are_unit_blocks_at_stride_m() -> None:
    with torch.no_grad():
        desc = _head()(_features())
    clusters = desc.view(2, L, M)  # l-major: (l, k) at l*M + k
    torch.testing.assert_close(clusters.norm(dim=1) * math.sqrt(M), torch.ones(2, M), atol=1e-6, rtol=0)
    assert not torch.allclose(desc.view(2, M, L).norm(dim=2) * math.sqrt(M), torch.ones(2, M), atol=1e-3)


@pytest.mark.parametrize("sinkhorn, queries", [(False, 3), (True, 5)])
def test_cluster_descriptors_live_in_the_span_of_the_codebook(sinkhorn: bool, queries: int) -> None:
    # V[:, k] = sum_q P[k, q] F[q, :] combines the image-independent codebook rows, whatever P is; with
    # fewer queries (3, or 5 > m for the transport) than dimensions (l = 8) that span is a strict subspace.
    torch.manual_seed(0)
    head = QAA(C, num_clusters=M, cluster_dim=L, num_queries=queries, feature_heads=2, score_heads=4,
               sinkhorn=sinkhorn).eval()
    with torch.no_grad():
        basis = head.queries_feature()[0].T  # [l, Nq]
        clusters = head(_features()).view(2, L, M)  # [B, l, m]
        random = torch.randn(2, L, M, generator=torch.Generator().manual_seed(9))

        def residual(v: torch.Tensor) -> torch.Tensor:
            coeffs = torch.linalg.lstsq(basis.expand(2, -1, -1), v).solution
            return (basis @ coeffs - v).abs().max()

    assert residual(clusters) < 1e-4
    assert residual(random) > 1e-1


def test_permuting_the_patches_does_not_change_the_descriptor() -> None:
    head, feats = _head(), _features(seed=1)
    perm = torch.randperm(30, generator=torch.Generator().manual_seed(2))
    shuffled = feats.last.flatten(2)[:, :, perm].view_as(feats.last)
    with torch.no_grad():
        torch.testing.assert_close(head(Features(maps=(shuffled,))), head(feats), atol=1e-5, rtol=0)


def test_each_image_is_described_independently_of_the_batch() -> None:
    head, feats = _head(), _features(batch=3, seed=3)
    with torch.no_grad():
        together = head(feats)
        alone = torch.cat([head(Features(maps=(feats.last[i : i + 1],))) for i in range(3)])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=0)


def test_port_state_dict_names_and_paper_size() -> None:
    head = QAA(768)
    assert head.out_dim == 8192
    keys = set(head.state_dict())
    for prefix in ("queries_feature", "queries_score"):
        assert {f"{prefix}.queries", f"{prefix}.self_attn.in_proj_weight", f"{prefix}.norm_q.weight"} <= keys
    assert {"score.cross_attn.in_proj_weight", "score.norm_out.weight", "score.conv.weight"} <= keys
    assert head.queries_feature.queries.shape == (1, 256, 128)
    assert head.queries_score.queries.shape == (1, 256, 768)
    assert head.score.conv.weight.shape == (64, 768, 1)


def test_channels_must_divide_into_heads() -> None:
    with pytest.raises(ValueError, match="in_channels=100 must be divisible"):
        QAA(100)


def _sinkhorn_with_dustbin(scores: torch.Tensor, z: float, iters: int = 3) -> torch.Tensor:
    """SALAD / SuperGlue's assignment, in the plain (not log) domain and float64, written from the formula:
    K = exp([S; z 1^T]) [m+1, n]; rows a = [1..1, n-m] / (n+m), columns b = 1 / (n+m); `iters` rounds of
    u = a / (K v), v = b / (K^T u) from v = 1; P = (n+m) diag(u) K diag(v) without the dustbin row."""
    s = scores.double()
    batch, m, n = s.shape
    kernel = torch.cat([s, torch.full((batch, 1, n), z, dtype=torch.float64)], dim=1).exp()
    a = torch.cat([torch.ones(m), torch.tensor([float(n - m)])]).double() / (n + m)
    b = torch.ones(n, dtype=torch.float64) / (n + m)
    v = torch.ones(batch, n, dtype=torch.float64)
    for _ in range(iters):
        u = a / torch.einsum("bij,bj->bi", kernel, v)
        v = b / torch.einsum("bij,bi->bj", kernel, u)
    plan = u[:, :, None] * kernel * v[:, None, :] * (n + m)
    return plan[:, :-1]


def test_sinkhorn_switch_equals_a_sinkhorn_with_dustbin_from_the_formula() -> None:
    head = _head()
    assert head.sinkhorn
    with torch.no_grad():
        head.dust_bin.fill_(0.4)
        feats = _features(seed=4)
        patches = feats.last.flatten(2).transpose(1, 2)
        scores = head.score(patches, head.queries_score())  # [B, m, Nq]
        expected_plan = _sinkhorn_with_dustbin(scores, 0.4)
        torch.testing.assert_close(head.assignment(scores).double(), expected_plan, atol=1e-6, rtol=1e-5)
        assert bool((head.assignment(scores).sum(dim=1) < 1).all())  # part of every query's mass is in the dustbin
        codebook = head.queries_feature()[0].double()  # [Nq, l]
        clusters = torch.nn.functional.normalize(torch.einsum("ql,bmq->blm", codebook, expected_plan), dim=1)
        expected = torch.nn.functional.normalize(clusters.flatten(1), dim=-1)
        torch.testing.assert_close(head(feats).double(), expected, atol=1e-5, rtol=0)
        port = QAA(C, num_clusters=M, cluster_dim=L, num_queries=NQ, feature_heads=2, score_heads=4, sinkhorn=False)
        port.load_state_dict({k: v for k, v in head.state_dict().items() if k != "dust_bin"})
        assert (port.eval()(feats) - head(feats)).abs().max() > 1e-2  # the switch does change the descriptor


def test_without_sinkhorn_the_scores_weigh_the_codebook_directly() -> None:
    torch.manual_seed(0)
    head = QAA(C, num_clusters=M, cluster_dim=L, num_queries=NQ, feature_heads=2, score_heads=4, sinkhorn=False).eval()
    assert not hasattr(head, "dust_bin")
    with torch.no_grad():
        feats = _features(seed=5)
        scores = head.score(feats.last.flatten(2).transpose(1, 2), head.queries_score())
        assert head.assignment(scores) is scores
        clusters = torch.einsum("ql,bmq->blm", head.queries_feature()[0], scores)
        expected = torch.nn.functional.normalize(torch.nn.functional.normalize(clusters, dim=1).flatten(1), dim=-1)
        torch.testing.assert_close(head(feats), expected, atol=1e-6, rtol=0)


def test_sinkhorn_needs_more_queries_than_clusters() -> None:
    with pytest.raises(ValueError, match="num_queries=4 queries to num_clusters=4"):
        QAA(C, num_clusters=M, cluster_dim=L, num_queries=4, feature_heads=2, score_heads=4)
    QAA(C, num_clusters=M, cluster_dim=L, num_queries=4, feature_heads=2, score_heads=4, sinkhorn=False)
