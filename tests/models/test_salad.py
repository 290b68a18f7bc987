"""SALAD and MegaLoc: layout, a float64 reference, errors, upstream key names."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from aggzoo.models.features import Features
from aggzoo.models.heads.megaloc import MegaLoc
from aggzoo.models.heads.salad import SALAD, salad_descriptor

C, M, L, G = 12, 4, 3, 5


def _features(batch: int = 2, size: int = 6, seed: int = 0, channels: int = C) -> Features:
    gen = torch.Generator().manual_seed(seed)
    return Features(maps=(torch.randn(batch, channels, size, size, generator=gen),),
                    cls=torch.randn(batch, channels, generator=gen))


def _head(**kwargs: object) -> SALAD:
    torch.manual_seed(0)
    return SALAD(C, num_clusters=M, cluster_dim=L, token_dim=G, **kwargs).eval()


def test_salad_descriptor_is_token_first_then_l_major() -> None:
    # Feature i goes entirely to cluster i, so V[l, k] = f[l, k] and the layout can be read off.
    f = torch.arange(1.0, 1.0 + L * M).view(1, L, M)  # f[l, k] = 1 + l*M + k
    plan = torch.eye(M).unsqueeze(0)
    token = torch.tensor([[3.0, 4.0, 0.0, 0.0, 0.0]])
    desc = salad_descriptor(token, f, plan)[0]
    scale = math.sqrt(1 + M)  # token part and each cluster have unit norm before the final L2
    torch.testing.assert_close(desc[:G] * scale, torch.tensor([0.6, 0.8, 0.0, 0.0, 0.0]))
    for k in range(M):
        column = f[0, :, k] / f[0, :, k].norm()
        for l_idx in range(L):
            assert desc[G + l_idx * M + k] * scale == pytest.approx(column[l_idx].item(), abs=1e-6)


def test_head_layout_token_part_first_and_unit_clusters_at_stride_m() -> None:
    head = _head()
    feats = _features()
    with torch.no_grad():
        desc = head(feats)
        token = F.normalize(head.token_features(feats.cls), dim=-1)
    scale = math.sqrt(1 + M)
    torch.testing.assert_close(desc[:, :G] * scale, token, atol=1e-6, rtol=0)
    clusters = desc[:, G:].view(2, L, M)  # l-major: entry (l, k) at l*M + k
    torch.testing.assert_close(clusters.norm(dim=1) * scale, torch.ones(2, M), atol=1e-6, rtol=0)
    # a cluster-major reading would not give unit blocks
    assert not torch.allclose(desc[:, G:].view(2, M, L).norm(dim=2) * scale, torch.ones(2, M), atol=1e-3)


def test_changing_only_the_cls_token_changes_only_the_token_part() -> None:
    head = _head()
    a = _features(seed=1)
    b = Features(maps=a.maps, cls=torch.randn(2, C))
    with torch.no_grad():
        da, db = head(a), head(b)
    torch.testing.assert_close(da[:, G:], db[:, G:], atol=0, rtol=0)
    assert not torch.allclose(da[:, :G], db[:, :G])


def test_matches_a_float64_reference_with_plain_sinkhorn() -> None:
    head = _head()
    feats = _features(size=5)
    with torch.no_grad():
        got = head(feats).double()
        x = feats.last.double()
        t = feats.cls.double()
        h64 = {k: v.double() for k, v in head.state_dict().items()}

        def mlp(prefix: str, inp: torch.Tensor) -> torch.Tensor:  # 1x1 convs as matmuls over [B, n, C]
            hid = torch.relu(inp @ h64[f"{prefix}.0.weight"][:, :, 0, 0].T + h64[f"{prefix}.0.bias"])
            return hid @ h64[f"{prefix}.3.weight"][:, :, 0, 0].T + h64[f"{prefix}.3.bias"]

        local = x.flatten(2).transpose(1, 2)  # [B, n, C]
        f = mlp("cluster_features", local)  # [B, n, l]
        s = mlp("score", local)  # [B, n, m]
        g = torch.relu(t @ h64["token_features.0.weight"].T + h64["token_features.0.bias"])
        g = g @ h64["token_features.2.weight"].T + h64["token_features.2.bias"]
        n = s.shape[1]
        kernel = torch.cat([s.transpose(1, 2), h64["dust_bin"].expand(2, 1, n)], dim=1).exp()
        a = torch.cat([torch.ones(M), torch.tensor([n - M])]).double() / (n + M)
        b = torch.ones(n).double() / (n + M)
        for _ in range(3):
            kernel = kernel * (a / kernel.sum(dim=2))[:, :, None]
            kernel = kernel * (b / kernel.sum(dim=1))[:, None, :]
        plan = kernel[:, :M] * (n + M)  # [B, m, n]
        v = torch.stack([(f * plan[:, k, :, None]).sum(dim=1) for k in range(M)], dim=2)  # [B, l, m]
        expected = F.normalize(torch.cat([F.normalize(g, dim=-1), F.normalize(v, dim=1).flatten(1)], dim=1), dim=1)
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=0)


def test_permuting_the_patches_does_not_change_the_descriptor() -> None:
    head = _head()
    feats = _features(size=6)
    perm = torch.randperm(36, generator=torch.Generator().manual_seed(2))
    shuffled = feats.last.flatten(2)[:, :, perm].view_as(feats.last)
    with torch.no_grad():
        torch.testing.assert_close(head(Features(maps=(shuffled,), cls=feats.cls)), head(feats), atol=1e-6, rtol=0)


def test_needs_a_cls_token() -> None:
    with pytest.raises(ValueError, match="SALAD needs a ViT backbone with a CLS token"):
        _head()(Features(maps=(torch.randn(1, C, 6, 6),)))


def test_too_small_a_map_raises_naming_n_and_m() -> None:
    head = SALAD(C)  # m = 64
    with pytest.raises(ValueError, match=r"n=64 local features .* m=64 clusters"):
        head(_features(batch=1, size=8))


def test_upstream_state_dict_names_and_paper_size() -> None:
    head = SALAD(768)
    assert head.out_dim == 8448
    assert set(head.state_dict()) == {
        "dust_bin", "token_features.0.weight", "token_features.0.bias", "token_features.2.weight",
        "token_features.2.bias", "cluster_features.0.weight", "cluster_features.0.bias",
        "cluster_features.3.weight", "cluster_features.3.bias", "score.0.weight", "score.0.bias",
        "score.3.weight", "score.3.bias",
    }
    assert head.dust_bin.item() == 1.0


def test_megaloc_is_a_linear_projection_of_salad() -> None:
    torch.manual_seed(0)
    head = MegaLoc(C, num_clusters=M, cluster_dim=L, token_dim=G, feat_dim=7).eval()
    feats = _features()
    with torch.no_grad():
        expected = F.normalize(head.linear(head.agg(feats)), dim=-1)
        torch.testing.assert_close(head(feats), expected)
    assert head.out_dim == 7 and head.agg.out_dim == M * L + G
    assert {k.split(".")[0] for k in head.state_dict()} == {"agg", "linear"}
    assert head.linear.weight.shape == (7, M * L + G)
