"""SuperVLAD against independent expectations: a brute-force loop, closed forms, NetVLAD with zero
centres, and the cross-image encoder's attention across the batch."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from aggzoo.evaluation.batch_dependence import batch_dependence_record
from aggzoo.models.features import Features
from aggzoo.models.heads.netvlad import NetVLAD, netvlad_alpha
from aggzoo.models.heads.supervlad import SuperVLAD


def _map(batch: int = 3, channels: int = 16, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, channels, 4, 5, generator=torch.Generator().manual_seed(seed))


def _randomise(head: SuperVLAD, seed: int = 1) -> SuperVLAD:
    with torch.no_grad():
        head.conv.weight.copy_(3 * torch.randn(head.conv.weight.shape, generator=torch.Generator().manual_seed(seed)))
    return head.eval()


def test_brute_force_loop_in_float64() -> None:
    head = _randomise(SuperVLAD(16, num_clusters=3, num_ghosts=2)).double()
    x = _map().double()
    out = head(Features((x,)))
    weight = head.conv.weight[:, :, 0, 0]  # [K+G, C]
    for b in range(x.shape[0]):
        rows = []
        positions = [F.normalize(x[b, :, i, j], dim=0) for i in range(4) for j in range(5)]
        scores = torch.stack([weight @ p for p in positions])  # [N, K+G]
        soft = torch.softmax(scores, dim=1)
        for k in range(3):  # the 2 ghosts are aggregated too, then dropped
            v = sum(soft[n, k] * positions[n] for n in range(len(positions)))
            rows.append(v / v.norm())
        expected = torch.cat(rows)
        torch.testing.assert_close(out[b], expected / expected.norm(), rtol=1e-10, atol=1e-12)


def test_uniform_assignment_gives_the_mean_direction_in_every_cluster() -> None:
    head = SuperVLAD(16, num_clusters=4, num_ghosts=1).eval()
    torch.nn.init.zeros_(head.conv.weight)  # softmax of zeros: every feature 1/(K+G) to every cluster
    x = _map()
    mean = F.normalize(F.normalize(x, dim=1).mean(dim=(2, 3)), dim=1)  # [B, C]
    expected = mean.repeat(1, 4) / 2.0  # K = 4 identical unit rows, then L2: each 1/sqrt(4)
    torch.testing.assert_close(head(Features((x,))), expected)


def test_one_cluster_vlad_is_the_assignment_weighted_mean_direction() -> None:
    head = _randomise(SuperVLAD(16, num_clusters=1, num_ghosts=2))
    x = _map()
    assert head.out_dim == 16
    normed = F.normalize(x, dim=1).flatten(2)                     # [B, C, N]
    weight = torch.softmax(head.conv(F.normalize(x, dim=1)).flatten(2), dim=1)[:, 0]  # [B, N]
    expected = F.normalize((normed * weight[:, None]).sum(-1), dim=1)
    torch.testing.assert_close(head(Features((x,))), expected)


def test_equals_netvlad_with_zero_centres_and_the_ghost_rows_cut() -> None:
    supervlad = _randomise(SuperVLAD(16, num_clusters=3, num_ghosts=1))
    netvlad = NetVLAD(16, num_clusters=4).eval()
    with torch.no_grad():
        netvlad.conv.weight.copy_(supervlad.conv.weight)
        netvlad.centroids.zero_()  # NetVLAD's residual x_i - c_k becomes x_i
    x = _map()
    full = netvlad(Features((x,))).view(3, 4, 16)
    expected = F.normalize(full[:, :3].flatten(1), dim=1)
    torch.testing.assert_close(supervlad(Features((x,))), expected)


def test_init_from_clusters_sets_alpha_times_unit_centres() -> None:
    head = SuperVLAD(8, num_clusters=2, num_ghosts=1)
    gen = torch.Generator().manual_seed(3)
    centroids = torch.randn(3, 8, generator=gen)
    descriptors = F.normalize(torch.randn(50, 8, generator=gen), dim=1)
    head.init_from_clusters(centroids, descriptors)
    alpha = netvlad_alpha(descriptors, centroids)
    torch.testing.assert_close(head.conv.weight[:, :, 0, 0], alpha * F.normalize(centroids, dim=1))
    assert head.kmeans_clusters == 3
    with pytest.raises(ValueError, match=r"\(3, 8\)"):
        head.init_from_clusters(centroids[:2], descriptors)


def test_cross_image_encoder_attends_across_the_batch_per_cluster() -> None:
    torch.manual_seed(0)
    head = _randomise(SuperVLAD(16, num_clusters=2, num_ghosts=1, cross_image=True, encoder_heads=4,
                                encoder_ffn_dim=32))
    assert head.batch_dependent and not SuperVLAD(16).batch_dependent
    x = _map(batch=4)
    with torch.no_grad():
        out = head(Features((x,)))
        # Upstream: encoder over the L2-normalised descriptor viewed [B, K, C], sequence = the batch, so
        # cluster slot k of image b attends over slot k of every image: encode each slot on its own.
        base = F.normalize(head.cluster_descriptors(Features((x,))).flatten(1), dim=1).view(4, 2, 16)
        slots = [head.encoder(base[:, k:k + 1])[:, 0] for k in range(2)]
        torch.testing.assert_close(out, F.normalize(torch.cat(slots, dim=1), dim=1), rtol=1e-5, atol=1e-6)
        # Batch dependence: image 0 with other companions gets another descriptor; a permuted batch
        # gets permuted descriptors (attention is order-free).
        other = head(Features((torch.cat([x[:1], _map(batch=3, seed=9)]),)))
        assert (other[0] - out[0]).abs().max() > 1e-4
        perm = torch.tensor([2, 0, 3, 1])
        torch.testing.assert_close(head(Features((x[perm],))), out[perm], rtol=1e-5, atol=1e-6)


def test_evaluation_records_and_warns_for_batch_dependent_heads(caplog: pytest.LogCaptureFixture) -> None:
    dependent = SuperVLAD(16, cross_image=True)
    with caplog.at_level(logging.WARNING, logger="aggzoo.evaluation.batch_dependence"):
        record = batch_dependence_record(torch.nn.Sequential(dependent), 8, name="pitts30k_test")
    assert record["batch_dependent"]["heads"] == ["SuperVLAD"] and record["batch_dependent"]["batch_size"] == 8
    assert "pitts30k_test: SuperVLAD is batch-dependent" in caplog.text and "batch size 8" in caplog.text
    assert batch_dependence_record(SuperVLAD(16), 8) == {}
