"""Test-time resolution rules, the protocol resize, multi-scale pooling and TLC."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

from aggzoo.evaluation.protocol import protocol_transform
from aggzoo.layers.local_pool import LocalWindow
from aggzoo.models.backbones.timm_backbone import TimmBackbone
from aggzoo.models.heads.avgpool import AvgPool
from aggzoo.models.input_size import size_multiple, snap_size
from aggzoo.models.multiscale import MultiScale
from aggzoo.models.tlc import convert_tlc
from aggzoo.models.vpr_model import VPRModel


def test_snap_size_rounds_to_nearest_multiple():
    assert snap_size(320, 14) == (322, 322)          # DINOv2 protocol size
    assert snap_size((480, 640), 14) == (476, 644)
    assert snap_size((320, 320), 16) == (320, 320)
    assert snap_size((3, 5), 14) == (14, 14)          # never below one patch
    assert snap_size((226.1, 7.0), 1) == (226, 7)


def test_size_multiple_per_backbone():
    assert size_multiple(VPRModel(TimmBackbone("test_vit"), AvgPool)) == \
        TimmBackbone("test_vit").model.patch_embed.patch_size[0]
    resnet = TimmBackbone("test_resnet")
    assert size_multiple(VPRModel(resnet, AvgPool)) == resnet.feature_info[-1]["reduction"] == 32
    assert size_multiple(nn.Linear(2, 2)) == 1


def test_protocol_transform_is_torchvision_bicubic_antialias():
    torchvision_f = pytest.importorskip("torchvision.transforms.functional")
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, size=(97, 131, 3), dtype=np.uint8)
    out = protocol_transform((40, 50), multiple=1)(image)
    reference = torchvision_f.normalize(
        torchvision_f.to_tensor(torchvision_f.resize(Image.fromarray(image), [40, 50],
                                                     interpolation=torchvision_f.InterpolationMode.BICUBIC,
                                                     antialias=True)),
        mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    assert out.shape == (3, 40, 50)
    torch.testing.assert_close(out, reference, atol=1e-5, rtol=0)
    assert protocol_transform(320, multiple=14)(image).shape == (3, 322, 322)


class SizeDescriptor(nn.Module):
    """Descriptor determined by the input size: (H, W, 10) (then L2), so pooling has a closed form."""

    out_dim = 3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        return torch.tensor([[float(h), float(w), 10.0]]).expand(x.shape[0], 3)


def test_multiscale_closed_form():
    images = torch.zeros(2, 3, 20, 40)
    descs = {s: F.normalize(torch.tensor([[20.0 * s, 40.0 * s, 10.0]]), dim=-1) for s in (0.5, 1.0, 2.0)}
    mean = MultiScale(SizeDescriptor(), (0.5, 1.0, 2.0), reduce="mean")(images)
    torch.testing.assert_close(mean, F.normalize(sum(descs.values()), dim=-1).expand(2, 3))
    peak = MultiScale(SizeDescriptor(), (0.5, 1.0, 2.0), reduce="max")(images)
    torch.testing.assert_close(peak, F.normalize(torch.maximum(torch.maximum(descs[0.5], descs[1.0]), descs[2.0]),
                                                 dim=-1).expand(2, 3))
    # snapped to the multiple: 0.7 x 20 = 14 -> 16, 0.7 x 40 = 28 -> 32 for multiple 16
    snapped = MultiScale(SizeDescriptor(), (0.7,), multiple=16)(images)
    torch.testing.assert_close(snapped, F.normalize(torch.tensor([[16.0, 32.0, 10.0]]), dim=-1).expand(2, 3))
    with pytest.raises(ValueError, match="reduce"):
        MultiScale(SizeDescriptor(), reduce="median")


def test_multiscale_single_scale_is_the_model():
    torch.manual_seed(0)
    model = VPRModel(TimmBackbone("test_resnet"), AvgPool).eval()
    x = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(MultiScale(model, (1.0,))(x), model(x))


def test_tlc_copy_leaves_the_model_and_keeps_training_size_outputs():
    torch.manual_seed(0)
    model = VPRModel(TimmBackbone("test_efficientnet"), AvgPool).eval()   # has squeeze-excite blocks
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        before = model(x)
        converted = convert_tlc(copy.deepcopy(model), 64)
        torch.testing.assert_close(converted.eval()(x), before, atol=1e-5, rtol=1e-5)   # same at train size
        big = torch.rand(1, 3, 160, 160)
        assert not torch.allclose(converted(big), model(big), atol=1e-4)              # local statistics now
    local = [m for m in converted.modules() if isinstance(m, LocalWindow)]
    assert local and not any(isinstance(m, LocalWindow) for m in model.modules())   # the original is untouched
    assert model.state_dict().keys() == converted.state_dict().keys()
