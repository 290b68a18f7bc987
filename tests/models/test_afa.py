"""Multi-level IDA/AFA head: wiring against the written-out formulas, ablation, backbones."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from aggzoo.layers.pooling import gem
from aggzoo.models.backbones.timm_backbone import TimmBackbone
from aggzoo.models.features import Features
from aggzoo.models.heads.afa import AFA
from aggzoo.models.heads.ida import IDA
from aggzoo.models.vpr_model import VPRModel


def _features(channels=(8, 16, 24), sizes=(16, 8, 4), batch=2, seed=0) -> Features:
    gen = torch.Generator().manual_seed(seed)
    return Features(maps=tuple(torch.randn(batch, c, s, s, generator=gen) for c, s in zip(channels, sizes)))


def test_in_channels_from_returns_every_level() -> None:
    info = [{"num_chs": 40, "reduction": 8}, {"num_chs": 112, "reduction": 16}, {"num_chs": 320, "reduction": 32}]
    assert AFA.in_channels_from(info) == (40, 112, 320)


def test_one_level_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="out_indices"):
        AFA(112)
    head = AFA((8, 16))
    with pytest.raises(ValueError, match="2 levels"):
        head(_features())


def test_afa_fusion_matches_the_written_out_formulas() -> None:
    torch.manual_seed(0)
    head = AFA((8, 16, 24), attention=True).eval()
    features = _features()
    with torch.no_grad():
        f1, f2, f3 = head.align(features)
        # IDA shallow -> deep with AFA's binary fusion.
        s, c = head.spatial[0](f1), head.channel[0](f2)
        x2 = s * (1 - c) * f1 + (1 - s) * c * f2
        s, c = head.spatial[1](x2), head.channel[1](f3)
        x3 = s * (1 - c) * x2 + (1 - s) * c * f3
        # Compositing with the shared attentions, x3 on top.
        s1, s2, s3 = (head.level_spatial(t) for t in (f1, x2, x3))
        c1, c2, c3 = (head.level_channel(t) for t in (f1, x2, x3))
        y = (s1 * (1 - s2) * (1 - s3)) * (c1 * (1 - c2) * (1 - c3)) * f1
        y = y + (s2 * (1 - s3)) * (c2 * (1 - c3)) * x2 + s3 * c3 * x3
        expected = F.normalize(gem(y, head.pool.p), dim=-1)
        torch.testing.assert_close(head(features), expected, atol=1e-5, rtol=1e-5)


def test_plain_ida_ablation_has_no_attention() -> None:
    torch.manual_seed(0)
    head = IDA((8, 16, 24)).eval()
    names = {name.split(".")[0] for name, _ in head.named_parameters()}
    assert names == {"proj", "nodes", "pool"}
    features = _features()
    with torch.no_grad():
        f1, f2, f3 = head.align(features)
        x3 = head.nodes[1](torch.cat((head.nodes[0](torch.cat((f1, f2), 1)), f3), 1))
        torch.testing.assert_close(head.fuse(features), x3)
    with_attention = AFA((8, 16, 24), attention=True)
    assert sum(p.numel() for p in with_attention.parameters()) != sum(p.numel() for p in head.parameters())


def test_fusion_weights_sum_to_at_most_one() -> None:
    torch.manual_seed(0)
    head = AFA((8, 16, 24)).eval()
    with torch.no_grad():
        states = head.ida_states(head.align(_features()))
        total = torch.stack(head.fusion_weights(states)).sum(0)
    assert ((total >= 0) & (total <= 1)).all()


def test_fusion_resolution_and_projection() -> None:
    features = _features()
    coarse = AFA((8, 16, 24)).eval()
    fine = AFA((8, 16, 24), fuse_level=0, dim=12, proj_dim=5).eval()
    assert coarse.fuse(features).shape == (2, 24, 4, 4)  # dim = C_L, at the coarsest level
    assert isinstance(coarse.proj[2], torch.nn.Identity)  # the deepest level already has dim channels
    assert fine.fuse(features).shape == (2, 12, 16, 16)
    out = fine(features)
    assert out.shape == (2, 5) and fine.out_dim == 5
    torch.testing.assert_close(out.norm(dim=1), torch.ones(2))


def test_shrinking_averages_areas_before_projecting() -> None:
    # A level that is constant on each 2x2 block is shrunk exactly to the block values.
    head = AFA((3, 3), dim=3).eval()
    coarse = torch.randn(1, 3, 4, 4)
    fine = coarse.repeat_interleave(2, dim=2).repeat_interleave(2, dim=3)
    aligned = head.align(Features(maps=(fine, coarse)))
    torch.testing.assert_close(aligned[0], coarse)


@pytest.mark.parametrize("name,out_indices,channels", [("test_resnet", (2, 3, 4), (48, 192, 96)), ("dla34", (2, 3, 4), (64, 128, 256))])
def test_on_timm_backbones(name: str, out_indices: tuple[int, ...], channels: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    model = VPRModel(TimmBackbone(name, out_indices=out_indices), AFA).eval()
    assert model.head.in_channels == channels
    with torch.no_grad():
        out = model(torch.randn(2, 3, 64, 64))
    assert out.shape == (2, channels[-1])
    torch.testing.assert_close(out.norm(dim=1), torch.ones(2))
