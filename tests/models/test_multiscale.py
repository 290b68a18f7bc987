"""SuperGlobal: GeM+ closed form, and scale-GeM (MultiScale, max, bilinear) equals the max of separate forwards."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from aggzoo.layers.pooling import regional_gem
from aggzoo.models.backbones.timm_backbone import TimmBackbone
from aggzoo.models.features import Features
from aggzoo.models.heads.gemplus import GeMPlus
from aggzoo.models.multiscale import MultiScale, resize_by
from aggzoo.models.vpr_model import VPRModel


def test_gemplus_is_the_fixed_power_mean() -> None:
    x = torch.rand(2, 5, 4, 3, dtype=torch.float64) + 0.01
    head = GeMPlus(5, regional=False)
    assert not any(p.requires_grad for p in head.parameters())
    expected = F.normalize(x.pow(4.6).mean(dim=(2, 3)).pow(1 / 4.6), dim=1)
    torch.testing.assert_close(head(Features((x.float(),))).double(), expected, atol=1e-6, rtol=1e-5)


def test_gemplus_by_default_pools_the_regional_gem_map() -> None:
    x = torch.rand(2, 5, 6, 7) + 0.01
    expected = F.normalize(regional_gem(x).pow(4.6).mean(dim=(2, 3)).pow(1 / 4.6), dim=1)
    torch.testing.assert_close(GeMPlus(5)(Features((x,))), expected, atol=1e-6, rtol=1e-5)


def test_gemplus_sits_between_mean_and_max() -> None:
    # one channel, values 0..1: the power mean with p = 4.6 lies strictly between mean and max
    x = torch.linspace(0.01, 1.0, 16).view(1, 1, 4, 4).repeat(1, 2, 1, 1)
    x[:, 1] = 1.0  # a constant channel: every power mean equals it
    pooled = GeMPlus(2).pool(x)
    assert x[0, 0].mean() < pooled[0, 0] < x[0, 0].max()
    torch.testing.assert_close(pooled[0, 1], torch.tensor(1.0))


def test_resize_floors_the_scaled_size_and_keeps_scale_one() -> None:
    x = torch.rand(1, 3, 50, 37)
    assert resize_by(x, 0.7071).shape[-2:] == (35, 26)
    assert resize_by(x, 1.4142).shape[-2:] == (70, 52)
    assert resize_by(x, 1.0) is x


@pytest.fixture(scope="module")
def model() -> VPRModel:
    torch.manual_seed(0)
    return VPRModel(TimmBackbone("test_resnet", out_indices=(3,)), GeMPlus).eval()


def test_scale_gem_equals_max_of_three_forwards(model: VPRModel) -> None:
    images = torch.randn(2, 3, 96, 80, generator=torch.Generator().manual_seed(1))
    wrapped = MultiScale(model, reduce="max", interpolation="bilinear")
    with torch.no_grad():
        out = wrapped(images)
        sizes = [(67, 56), (96, 80), (135, 113)]  # floor(0.7071 * .), itself, floor(1.4142 * .)
        descs = [
            model(F.interpolate(images, size=s, mode="bilinear", align_corners=False, antialias=True))
            if s != (96, 80) else model(images)
            for s in sizes
        ]
    expected = F.normalize(torch.stack(descs).max(dim=0).values, dim=1)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)
    assert wrapped.out_dim == model.out_dim
    # each scale matters: the result differs from the single-scale descriptor
    assert not torch.allclose(out, descs[1])


def test_single_scale_is_the_model(model: VPRModel) -> None:
    images = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(MultiScale(model, (1.0,), reduce="max", interpolation="bilinear")(images), model(images))


def test_bad_scales_rejected(model: VPRModel) -> None:
    with pytest.raises(ValueError, match="positive scale"):
        MultiScale(model, scales=())
    with pytest.raises(ValueError, match="positive scale"):
        MultiScale(model, scales=(1.0, -0.5))
