"""QAA: l-major layout, permutation invariance, per-image independence, upstream names."""

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


def test_cluster_descriptors_live_in_the_span_of_the_codebook() -> None:
    # V[:, k] = sum_q P[k, q] F[q, :] combines the image-independent codebook rows; with fewer
    # queries (3) than dimensions (l = 8) that span is a strict subspace.
    torch.manual_seed(0)
    head = QAA(C, num_clusters=M, cluster_dim=L, num_queries=3, feature_heads=2, score_heads=4).eval()
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
