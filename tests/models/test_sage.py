"""SAGE against independent expectations: the power norm's and the soft weighting's closed forms, the
bilinear aggregation by brute force, the whole head re-derived step by step from the authors' description
(including the score centring it skips), the power-recalibrated ViT against timm's own blocks, and the
cross-image encoder's dependence on the batch."""

from __future__ import annotations

import functools
import inspect
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

import aggzoo.zoo.sage as zoo_sage
from aggzoo.evaluation.batch_dependence import batch_dependent_heads
from aggzoo.layers.power_norm import DynamicPowerNorm
from aggzoo.models.backbones.power_recalibration import PowerRecalibratedViT
from aggzoo.models.backbones.timm_backbone import TimmBackbone
from aggzoo.models.features import Features
from aggzoo.models.heads.sage import SAGE, SoftWeighting, bilinear_clusters
from aggzoo.models.vpr_model import VPRModel

REPO = Path(__file__).resolve().parents[2]


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_power_norm_with_a_constant_exponent_is_the_signed_power_plus_input() -> None:
    norm = DynamicPowerNorm(3, 2, eps=0.0).eval()
    with torch.no_grad():
        for layer in (norm.projection[0], norm.projection[3]):
            layer.weight.zero_()
            layer.bias.zero_()
        norm.projection[3].bias.fill_(math.log(0.25 / 0.75))  # sigmoid -> p = 0.25
    x = torch.tensor([[[16.0, -81.0, 0.0], [1.0, -1.0, 625.0]]])
    expected = torch.tensor([[[2.0, -3.0, 0.0], [1.0, -1.0, 5.0]]]) + x
    torch.testing.assert_close(norm(x), expected)


def test_power_norm_exponent_is_predicted_from_the_mean_over_the_sequence() -> None:
    torch.manual_seed(0)
    norm = DynamicPowerNorm(4, 3).eval()
    x = torch.randn(2, 5, 4, generator=_gen())
    w1, b1 = norm.projection[0].weight, norm.projection[0].bias
    w2, b2 = norm.projection[3].weight, norm.projection[3].bias
    for b in range(2):
        mean = x[b].sum(0) / 5
        p = torch.sigmoid(w2 @ torch.clamp(w1 @ mean + b1, min=0) + b2)
        expected = torch.sign(x[b]) * (x[b].abs() + 1e-6) ** p + x[b]
        torch.testing.assert_close(norm(x)[b], expected)


def test_soft_weighting_closed_form() -> None:
    weighting = SoftWeighting(hidden_dim=1, alpha=0.5, eps=0.0)
    with torch.no_grad():  # predictor(r) = sigmoid(2 relu(r) - 3)
        weighting.predictor[0].weight.fill_(1.0)
        weighting.predictor[0].bias.zero_()
        weighting.predictor[2].weight.fill_(2.0)
        weighting.predictor[2].bias.fill_(-3.0)
    x = torch.zeros(1, 2, 1, 2)
    x[0, :, 0, 0] = torch.tensor([3.0, 4.0])  # ||x|| = 5: weight 1 + 0.5 sigmoid(7)
    x[0, :, 0, 1] = torch.tensor([0.0, 1.5])  # ||x|| = 1.5: weight 1 + 0.5 sigmoid(0) = 1.25
    out = weighting(x)
    torch.testing.assert_close(out[0, :, 0, 0], torch.tensor([3.0, 4.0]) * (1 + 0.5 * torch.sigmoid(torch.tensor(7.0))))
    torch.testing.assert_close(out[0, :, 0, 1], torch.tensor([0.0, 1.875]))


def test_bilinear_clusters_by_brute_force() -> None:
    gen = _gen(1)
    f, s = torch.randn(2, 3, 5, generator=gen), torch.randn(2, 4, 5, generator=gen)
    out = bilinear_clusters(f, s)
    for b in range(2):
        mean = sum(f[b, i, n] for i in range(3) for n in range(5)) / 15
        for i in range(3):
            for m in range(4):
                weights = [math.exp(s[b, m, n]) for n in range(5)]
                expected = sum((f[b, i, n] - mean) * w for n, w in zip(range(5), weights)) / sum(weights)
                assert out[b, i, m].item() == pytest.approx(float(expected), abs=1e-5)


def _reference(head: SAGE, x: torch.Tensor, cls: torch.Tensor) -> torch.Tensor:
    """The head re-derived from chenshunpeng/SAGE's description, step by step, with upstream's centring of the
    scores (``adaptive_avg_pool2d`` of ``[B, m, n]``: one mean over ``m`` and ``n``) that the head skips."""
    batch, channels, height, width = x.shape
    tokens = x.reshape(batch, channels, -1).transpose(1, 2)  # [B, n, C]
    beta = head.soft_weighting.alpha * head.soft_weighting.predictor(tokens.norm(dim=-1, keepdim=True) + 1e-6)
    x = (tokens * (1 + beta)).transpose(1, 2).reshape(batch, channels, height, width)
    f = head.cluster_features(x).flatten(2)
    s = head.score(x).flatten(2)
    f = f - f.mean(dim=(1, 2), keepdim=True)
    s = s - s.mean(dim=(1, 2), keepdim=True)
    v = torch.bmm(f, torch.softmax(s, dim=2).transpose(1, 2)) / s.shape[2]  # [B, l, m]
    pooled = v.transpose(1, 2).mean(-1)  # upstream: AdaptiveAvgPool1d over l
    p = torch.sigmoid(head.gpn.projection(pooled)).unsqueeze(-1)
    v = F.normalize(torch.sign(v) * torch.pow(v.abs() + 1e-6, p) + v, dim=1)
    token = F.normalize(head.token_features(cls), dim=-1)
    return F.normalize(torch.cat([token, v.reshape(batch, -1)], dim=-1), dim=-1)


def test_head_against_a_step_by_step_reference() -> None:
    torch.manual_seed(0)
    head = SAGE(16, num_clusters=6, cluster_dim=5, token_dim=4).eval()
    gen = _gen(2)
    x, cls = torch.randn(3, 16, 4, 5, generator=gen), torch.randn(3, 16, generator=gen)
    with torch.no_grad():
        out = head(Features((x,), cls=cls))
        torch.testing.assert_close(out, _reference(head, x, cls), atol=1e-6, rtol=1e-5)
    assert out.shape == (3, 6 * 5 + 4) == (3, head.out_dim)
    torch.testing.assert_close(out.norm(dim=1), torch.ones(3))


def test_cross_image_encoder_makes_the_descriptor_depend_on_the_batch() -> None:
    torch.manual_seed(0)
    head = SAGE(32, num_clusters=8, cluster_dim=8, token_dim=64, cross_image=True, encoder_dim=32,
                encoder_heads=4, encoder_ffn_dim=16).eval()
    plain = SAGE(32, num_clusters=8, cluster_dim=8, token_dim=64).eval()
    plain.load_state_dict({k: v for k, v in head.state_dict().items() if not k.startswith("encoder.")})
    gen = _gen(3)
    x, cls = torch.randn(4, 32, 3, 3, generator=gen), torch.randn(4, 32, generator=gen)
    with torch.no_grad():
        together = head(Features((x,), cls=cls))
        alone = head(Features((x[:1],), cls=cls[:1]))
        others = head(Features((x[[0, 3]],), cls=cls[[0, 3]]))
        # the encoder reads the aggregator's output cut into out_dim / encoder_dim = 4 tokens
        encoded = head.encoder(plain(Features((x,), cls=cls)).view(4, 4, 32)).flatten(1)
        plain_together, plain_alone = plain(Features((x,), cls=cls)), plain(Features((x[:1],), cls=cls[:1]))
    assert head.batch_dependent and not plain.batch_dependent
    assert not torch.allclose(together[0], alone[0], atol=1e-3)
    assert not torch.allclose(together[0], others[0], atol=1e-3)
    torch.testing.assert_close(together, encoded)
    torch.testing.assert_close(plain_together[0], plain_alone[0])
    assert not torch.allclose(together.norm(dim=1), torch.ones(4))  # upstream: no L2 after the encoder


def test_l2_after_encoder_and_chunk_size_check() -> None:
    head = SAGE(32, num_clusters=8, cluster_dim=8, token_dim=64, cross_image=True, encoder_dim=32,
                encoder_heads=4, encoder_ffn_dim=16, l2_after_encoder=True).eval()
    gen = _gen(4)
    with torch.no_grad():
        out = head(Features((torch.randn(3, 32, 3, 3, generator=gen),), cls=torch.randn(3, 32, generator=gen)))
    torch.testing.assert_close(out.norm(dim=1), torch.ones(3))
    with pytest.raises(ValueError, match="encoder_dim"):
        SAGE(32, num_clusters=8, cluster_dim=8, token_dim=60, cross_image=True, encoder_dim=32)


def _vit(cls: type[TimmBackbone], **kwargs: object) -> TimmBackbone:
    torch.manual_seed(0)
    return cls("test_vit", dynamic_img_size=True, **kwargs)


def test_recalibrated_vit_is_timm_plus_a_power_norm_after_the_last_blocks() -> None:
    ours = _vit(PowerRecalibratedViT, recalibrated_blocks=2, hidden_dim=3).eval()
    plain = _vit(TimmBackbone).eval()
    plain.load_state_dict({k: v for k, v in ours.state_dict().items() if not k.startswith("recalibrations.")})
    images = torch.randn(2, 3, 64, 48, generator=_gen(5))
    vit = plain.model
    depth = len(vit.blocks)
    with torch.no_grad():
        tokens = vit.norm_pre(vit._pos_embed(vit.patch_embed(images)))
        for index, block in enumerate(vit.blocks):
            tokens = block(tokens)
            if index >= depth - 2:
                tokens = ours.recalibrations[index - (depth - 2)](tokens)
        tokens = vit.norm(tokens)
        got = ours(images)
    torch.testing.assert_close(got.cls, tokens[:, 0])
    torch.testing.assert_close(got.last, plain.patch_map(tokens, (64, 48)))
    none = _vit(PowerRecalibratedViT, recalibrated_blocks=0).eval()
    with torch.no_grad():
        torch.testing.assert_close(none(images).last, plain(images).last)


def test_recalibrated_vit_trains_only_the_power_norms_and_the_final_norm() -> None:
    backbone = _vit(PowerRecalibratedViT, recalibrated_blocks=2)
    trainable = {name.split(".")[0] + "." + name.split(".")[1] for name, p in backbone.named_parameters()
                 if p.requires_grad}
    assert trainable == {"model.norm", "recalibrations.0", "recalibrations.1"}
    backbone.train()
    assert backbone.model.norm.training and not backbone.model.blocks[0].norm1.training
    with pytest.raises(ValueError, match="recalibrated_blocks"):
        _vit(PowerRecalibratedViT, recalibrated_blocks=len(backbone.model.blocks) + 1)


def test_model_with_the_encoder_is_named_batch_dependent() -> None:
    head = functools.partial(SAGE, num_clusters=4, cluster_dim=4, token_dim=16, cross_image=True, encoder_dim=8,
                             encoder_heads=2)
    assert batch_dependent_heads(VPRModel(_vit(PowerRecalibratedViT), head)) == ["SAGE"]
    assert batch_dependent_heads(VPRModel(_vit(PowerRecalibratedViT), SAGE)) == []


@pytest.mark.parametrize(("yaml_name", "spec_name"), [("sage_dinov2_vitl14", "SAGE_DINOV2_VITL14"),
                                                      ("sage_dinov2_vitb14", "SAGE_DINOV2_VITB14")])
def test_backbone_yaml_agrees_with_the_zoo_spec(yaml_name: str, spec_name: str) -> None:
    yaml = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "backbone" / f"{yaml_name}.yaml"))
    spec = getattr(zoo_sage, spec_name)
    yaml.pop("pretrained")
    defaults = {k: p.default for k, p in inspect.signature(PowerRecalibratedViT.__init__).parameters.items()}
    assert {k: spec.get(k, defaults.get(k)) for k in yaml} == yaml
