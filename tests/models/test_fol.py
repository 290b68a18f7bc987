"""FoL against independent expectations: the class-token attention from the full attention matrix, the
per-feature dustbin against a Sinkhorn written from its marginals, the head's descriptor and region selection
by hand, and FoL's re-ranking score (mutual nearest neighbours above cosine 0.7) against a loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from aggzoo.evaluation.local_rerank import FOL_MIN_SIMILARITY, fol_rerank, mutual_nn_counts
from aggzoo.evaluation.options import RerankOptions
from aggzoo.evaluation.test_time import build_reranker
from aggzoo.layers.sinkhorn import log_optimal_transport
from aggzoo.models.backbones.class_attention import ClassAttentionViT
from aggzoo.models.backbones.timm_backbone import TimmBackbone
from aggzoo.models.features import Features
from aggzoo.models.heads.fol import FoL, flatten_peaks

TINY = {"depth": 2, "embed_dim": 64, "num_heads": 4, "dynamic_img_size": True}


def test_class_attention_is_the_class_row_of_the_last_blocks_attention() -> None:
    torch.manual_seed(0)
    vit = ClassAttentionViT("vit_small_patch14_dinov2", **TINY).eval()
    plain = TimmBackbone("vit_small_patch14_dinov2", **TINY).eval()
    plain.model.load_state_dict(vit.model.state_dict())
    images = torch.randn(2, 3, 70, 56)
    with torch.no_grad():
        ours, reference = vit(images), plain(images)
        # The full [N, N] attention of the last block, from its input (the output of block 0).
        block = vit.model.blocks[-1]
        tokens = vit.model.blocks[0](vit.embed_tokens(images))
        y = block.norm1(tokens)
        q, k, _ = block.attn.qkv(y).reshape(2, y.shape[1], 3, 4, 16).unbind(2)       # [B, N, h, d]
        full = torch.einsum("bnhd,bmhd->bhnm", q, k).mul(16 ** -0.5).softmax(dim=-1)  # [B, h, N, N]
    torch.testing.assert_close(ours.last, reference.last)
    torch.testing.assert_close(ours.cls, reference.cls)
    assert ours.cls_attention.shape == (2, 5 * 4)
    torch.testing.assert_close(ours.cls_attention, full[:, :, 0, 1:].sum(dim=1))
    # Each head's row sums to 1 over all tokens: the class token's share on itself is the rest.
    torch.testing.assert_close(ours.cls_attention.sum(1) + full[:, :, 0, 0].sum(1), torch.full((2,), 4.0))


def _sinkhorn_reference(scores: np.ndarray, dustbin: np.ndarray, iters: int = 3) -> np.ndarray:
    """Log-domain Sinkhorn from the marginals a = [1..1, n - m] / (n + m), b = 1 / (n + m), scaled by n + m."""
    m, n = scores.shape
    z = np.vstack([scores, dustbin[None]]).astype(np.float64)
    log_a = np.full(m + 1, -np.log(n + m))
    log_a[-1] = np.log(n - m) - np.log(n + m)
    log_b = np.full(n, -np.log(n + m))
    u, v = np.zeros(m + 1), np.zeros(n)
    for _ in range(iters):
        u = log_a - np.log(np.exp(z + v[None]).sum(1))
        v = log_b - np.log(np.exp(z + u[:, None]).sum(0))
    return z + u[:, None] + v[None] + np.log(n + m)


def test_a_dustbin_per_feature_equals_sinkhorn_from_its_marginals() -> None:
    gen = torch.Generator().manual_seed(0)
    scores, dustbin = torch.randn(2, 4, 9, generator=gen), torch.rand(2, 9, generator=gen)
    plan = log_optimal_transport(scores, dustbin, num_iters=3)
    for b in range(2):
        expected = _sinkhorn_reference(scores[b].numpy(), dustbin[b].numpy())
        np.testing.assert_allclose(plan[b].numpy(), expected, atol=1e-5)
    torch.testing.assert_close(plan.exp().sum(1), torch.ones(2, 9))  # each feature's mass is 1
    with pytest.raises(ValueError, match=r"\[B, n\]"):
        log_optimal_transport(scores, dustbin[:, :5])


def test_flatten_peaks_by_hand() -> None:
    # n = 40: rank int(0.05 * 40) = 2 (0-based, descending); the 3 largest become the third largest.
    row = torch.arange(40.0).flip(0).unsqueeze(0)  # 39, 38, ..., 0
    out = flatten_peaks(row)
    assert out[0, :3].tolist() == [37.0, 37.0, 37.0] and torch.equal(out[0, 3:], row[0, 3:])


def _features(channels: int = 32, grid: tuple[int, int] = (5, 4), seed: int = 0) -> Features:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, channels, *grid, generator=gen)
    attention = 4 * torch.randn(2, grid[0] * grid[1], generator=gen).softmax(-1)
    attention[:, 0] = 0.005  # under the 0.01 floor: no guidance there
    return Features(maps=(x,), cls=torch.randn(2, channels, generator=gen), cls_attention=attention)


def test_global_descriptor_by_hand() -> None:
    torch.manual_seed(0)
    head = FoL(32, num_clusters=6, cluster_dim=8, token_dim=4, num_selected=7, local_dim=8).eval()
    features = _features()
    x, a = features.last, features.cls_attention
    guidance = torch.where(a >= 0.01, a, torch.zeros_like(a))
    assert guidance[:, 0].eq(0).all()
    plan = torch.stack([torch.from_numpy(_sinkhorn_reference(s.numpy(), 1 - g.numpy())[:-1]).exp()
                        for s, g in zip(head.score(x).flatten(2).detach(), guidance)]).float()
    local = head.cluster_features(x).flatten(2)                               # [B, l, n]
    clusters = torch.stack([local[b] @ plan[b].T for b in range(2)])          # [B, l, m]
    expected = F.normalize(torch.cat([F.normalize(head.token_features(features.cls), dim=-1),
                                      F.normalize(clusters, dim=1).flatten(1)], dim=1), dim=1)
    with torch.no_grad():
        torch.testing.assert_close(head(features), expected.detach(), atol=1e-5, rtol=1e-5)
    assert head.out_dim == 6 * 8 + 4


def test_local_features_are_the_reliable_patches_locations_row_major() -> None:
    torch.manual_seed(1)
    head = FoL(32, num_clusters=6, cluster_dim=8, token_dim=4, num_selected=7, local_dim=8).eval()
    features = _features()
    with torch.no_grad():
        local = head.local_features(features)
        plan, _ = head.assignment(features.last, features.cls_attention)
        confidence = flatten_peaks(plan.mean(1)).softmax(-1)
        dense = F.normalize(head.local_adapt(features.last).permute(0, 2, 3, 1), dim=-1)  # [B, 17, 13, l]
    grid, out = (5, 4), (17, 13)
    # Capacity: 7 patches x ceil(17 / 5) x ceil(13 / 4) locations each.
    assert local.shape == (2, 7 * 4 * 4, 8)
    for b in range(2):
        chosen = set(torch.topk(confidence[b], 7).indices.tolist())
        # Nearest-neighbour upsampling: location (i, j) belongs to patch (floor(i * 5 / 17), floor(j * 4 / 13)).
        kept = [dense[b, i, j] for i in range(out[0]) for j in range(out[1])
                if (i * grid[0] // out[0]) * grid[1] + (j * grid[1] // out[1]) in chosen]
        torch.testing.assert_close(local[b, :len(kept)], torch.stack(kept))
        assert local[b, len(kept):].abs().sum() == 0


def test_training_mode_adds_the_attention_to_the_region_weights() -> None:
    torch.manual_seed(2)
    head = FoL(32, num_clusters=6, cluster_dim=8, token_dim=4, num_selected=7, local_dim=8, dropout=0.0)
    features = _features()
    head.train()
    train = head.outputs(features)
    torch.testing.assert_close(train.importance, flatten_peaks(features.cls_attention).softmax(-1))
    torch.testing.assert_close(train.region_weights, train.confidence + train.importance)
    head.eval()
    torch.testing.assert_close(head.outputs(features).region_weights, train.confidence)


def test_fol_head_refuses_features_without_the_class_attention() -> None:
    head = FoL(32, num_clusters=6)
    features = _features()
    with pytest.raises(ValueError, match="cls_attention"):
        head(Features(maps=features.maps, cls=features.cls))


def _authors_rule_count(query: np.ndarray, candidate: np.ndarray, threshold: float = 0.7) -> int:
    """For each query feature j: its best candidate feature i; a match when j is i's best query feature and
    their dot product exceeds the threshold (chenshunpeng/FoL test_FoL.py match_batch_tensor)."""
    sims = candidate @ query.T   # [M, L]
    count = 0
    for j in range(query.shape[0]):
        i = int(np.argmax(sims[:, j]))
        count += int(np.argmax(sims[i]) == j and sims[i, j] > threshold)
    return count


def test_thresholded_mutual_nn_counts_equal_the_authors_rule() -> None:
    gen = np.random.default_rng(0)
    def unit(a: np.ndarray) -> np.ndarray:
        return (a / np.linalg.norm(a, axis=-1, keepdims=True)).astype(np.float32)

    query = unit(gen.standard_normal((40, 6)))
    query[30:] = 0  # FoL's zero padding
    candidates = unit(gen.standard_normal((4, 50, 6)))
    candidates[1, :30] = unit(query[:30] + 0.3 * gen.standard_normal((30, 6)))  # noisy copies: some above 0.7
    candidates[2, 45:] = 0
    counts = mutual_nn_counts(torch.from_numpy(query), torch.from_numpy(candidates), FOL_MIN_SIMILARITY).numpy()
    expected = [_authors_rule_count(query, c) for c in candidates]
    assert counts.tolist() == expected and 0 < expected[1] < 30
    # Without the threshold the same pairs count and more (SelaVPR's rule).
    assert (mutual_nn_counts(torch.from_numpy(query), torch.from_numpy(candidates)).numpy() >= counts).all()


def test_method_fol_builds_the_fol_reranker() -> None:
    reranker = build_reranker(RerankOptions(method="fol"))
    assert reranker == fol_rerank() and reranker.top_k == 100 and reranker.min_similarity == 0.7
    assert reranker.local_dtype == "float32" and build_reranker(RerankOptions(method="fol", k=20)).top_k == 20


def test_preflight_names_the_backbone_that_gives_the_class_attention() -> None:
    from aggzoo.run.preflight import declared_needs_problem

    backbone = TimmBackbone("test_vit", dynamic_img_size=True).eval()
    head = FoL(backbone.out_channels, num_clusters=4)
    with torch.no_grad():
        features = backbone(torch.randn(1, 3, 48, 48))
    assert "backbone=fol_dinov2_vitb14" in declared_needs_problem(head, backbone, features)
    attention_backbone = ClassAttentionViT("test_vit", dynamic_img_size=True).eval()
    with torch.no_grad():
        assert declared_needs_problem(head, attention_backbone, attention_backbone(torch.randn(1, 3, 48, 48))) is None
