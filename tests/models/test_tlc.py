"""TLC conversion: identical at the training size, brute-force local windows at 2x, unchanged
state_dict, final descriptor pooling untouched, fp32 local statistics under bf16 autocast."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from timm.layers.cbam import ChannelAttn, LightChannelAttn
from timm.layers.eca import CecaModule, EcaModule
from timm.layers.global_context import GlobalContext
from timm.layers.squeeze_excite import EffectiveSEModule, SEModule, SqueezeExciteCl
from torch import nn

from aggzoo.layers.local_pool import LocalAvgPool2d, LocalWindow
from aggzoo.layers.pooling import GeMPool, gem
from aggzoo.models.backbones.timm_backbone import TimmBackbone
from aggzoo.models.heads.afa import AFA
from aggzoo.models.heads.gcnet import GCNet
from aggzoo.models.heads.gem import GeM
from aggzoo.models.tlc import convert_tlc, local_windows
from aggzoo.models.vpr_model import VPRModel

TRAIN = 64


def _images(size: int, batch: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(seed))


def _brute_local_mean(x: torch.Tensor, kernel: tuple[int, int]) -> torch.Tensor:
    """avg_pool2d over stride-1 windows of the clipped kernel, replicate-padded back to H x W."""
    kh, kw = min(kernel[0], x.shape[-2]), min(kernel[1], x.shape[-1])
    valid = F.avg_pool2d(x.float(), (kh, kw), stride=1)
    dh, dw = x.shape[-2] - valid.shape[-2], x.shape[-1] - valid.shape[-1]
    return F.pad(valid, (dw // 2, dw - dw // 2, dh // 2, dh - dh // 2), mode="replicate")


def _se_model() -> VPRModel:
    torch.manual_seed(0)
    # test_efficientnet: EfficientNet blocks with timm's SqueezeExcite in its last two stages.
    return VPRModel(TimmBackbone("test_efficientnet", out_indices=(4,)), GeM).eval()


def test_identical_at_training_size_and_state_dict_unchanged() -> None:
    model = _se_model()
    converted = convert_tlc(copy.deepcopy(model), TRAIN)
    assert len(local_windows(converted)) == 2  # both SE blocks
    before, after = model.state_dict(), converted.state_dict()
    assert list(before) == list(after)
    assert all(torch.equal(before[k], after[k]) for k in before)
    with torch.no_grad():
        torch.testing.assert_close(converted(_images(TRAIN)), model(_images(TRAIN)), atol=1e-5, rtol=0)


def test_window_size_follows_the_training_map() -> None:
    model = _se_model()
    sizes = {}

    def record(name: str, x: torch.Tensor) -> None:
        sizes[name] = tuple(x.shape[-2:])

    for name, module in model.named_modules():
        if type(module).__name__ == "SqueezeExcite":
            module.register_forward_pre_hook(lambda m, args, name=name: record(name, args[0]))
    with torch.no_grad():
        model(_images(TRAIN, batch=1))
    windows = local_windows(convert_tlc(model, TRAIN, base_ratio=1.5))
    base = int(TRAIN * 1.5)
    assert windows == {f"{name}.tlc_pool": (h * base // TRAIN, w * base // TRAIN) for name, (h, w) in sizes.items()}


def test_local_means_equal_brute_force_at_twice_the_training_size() -> None:
    model = _se_model()
    reference = copy.deepcopy(model)
    converted = convert_tlc(model, TRAIN)
    checked = []

    def check(module: LocalAvgPool2d, args: tuple[torch.Tensor], out: torch.Tensor) -> None:
        x = args[0]
        assert module.kernel_size[0] < x.shape[-2]  # really local at 2x
        torch.testing.assert_close(out.float(), _brute_local_mean(x, module.kernel_size), atol=1e-5, rtol=1e-5)
        checked.append(module)

    for module in converted.modules():
        if isinstance(module, LocalAvgPool2d):
            module.register_forward_hook(check)
    with torch.no_grad():
        out = converted(_images(2 * TRAIN))
        assert len(checked) == 2
        # The conversion changes what the network computes at this size.
        assert not torch.allclose(out, reference(_images(2 * TRAIN)), atol=1e-4)


def test_local_statistics_stay_fp32_under_bf16_autocast() -> None:
    converted = convert_tlc(_se_model(), TRAIN)
    seen = []

    def check(module: LocalAvgPool2d, args: tuple[torch.Tensor], out: torch.Tensor) -> None:
        # The window means are accumulated in fp32 and rounded once to the input's bf16: within
        # one bf16 rounding (2^-8 relative) of the fp32 brute force. bf16 cumulative sums over
        # hundreds of pixels would be off by far more.
        expected = _brute_local_mean(args[0], module.kernel_size)
        assert out.dtype == torch.bfloat16
        assert ((out.float() - expected).abs() <= expected.abs() * 2**-8 + 1e-6).all()
        seen.append(args[0].dtype)

    for module in converted.modules():
        if isinstance(module, LocalAvgPool2d):
            module.register_forward_hook(check)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = converted(_images(2 * TRAIN))
    assert torch.isfinite(out.float()).all() and torch.bfloat16 in seen


def test_final_descriptor_pooling_is_never_converted() -> None:
    # A model whose only global operation is the descriptor pooling: nothing to convert, and the
    # output at 2x is still the global GeM (a converted GeM would give a different value or a map).
    torch.manual_seed(0)
    model = VPRModel(TimmBackbone("test_resnet", out_indices=(3,)), GeM).eval()
    reference = copy.deepcopy(model)
    converted = convert_tlc(model, TRAIN)
    assert local_windows(converted) == {}
    with torch.no_grad():
        torch.testing.assert_close(converted(_images(2 * TRAIN)), reference(_images(2 * TRAIN)))


def test_multilevel_head_attention_converted_descriptor_pool_global() -> None:
    torch.manual_seed(0)
    model = VPRModel(TimmBackbone("test_resnet", out_indices=(2, 3, 4)), AFA).eval()
    reference = copy.deepcopy(model)
    converted = convert_tlc(model, TRAIN)
    names = set(local_windows(converted))
    assert names and all(n.startswith("head.channel.") or n.startswith("head.level_channel.") for n in names)
    assert type(converted.head.pool) is GeMPool
    with torch.no_grad():
        torch.testing.assert_close(converted(_images(TRAIN)), reference(_images(TRAIN)), atol=1e-5, rtol=0)
        big = _images(2 * TRAIN)
        fused = converted.head.fuse(converted.backbone(big))
        assert fused.shape[-1] == 4 and converted.head.level_channel.avg_pool.kernel_size == (3, 3)
        torch.testing.assert_close(converted(big), F.normalize(gem(fused, converted.head.pool.p), dim=-1))


def test_gcnet_head_context_becomes_local() -> None:
    torch.manual_seed(0)
    model = VPRModel(TimmBackbone("test_resnet", out_indices=(3,)), GCNet).eval()
    nn.init.normal_(model.head.block.channel_add_conv[3].weight, std=0.1)  # not the identity any more
    reference = copy.deepcopy(model)
    converted = convert_tlc(model, TRAIN)
    assert set(local_windows(converted)) == {"head.block.pool"}
    with torch.no_grad():
        torch.testing.assert_close(converted(_images(TRAIN)), reference(_images(TRAIN)), atol=1e-5, rtol=0)
        assert not torch.allclose(converted(_images(2 * TRAIN)), reference(_images(2 * TRAIN)), atol=1e-4)


def _timm_attention_stack() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=4, padding=1),
        SEModule(16, add_maxpool=True),
        EffectiveSEModule(16),
        ChannelAttn(16),
        LightChannelAttn(16),
        GlobalContext(16, fuse_add=True),
        GlobalContext(16, use_attn=False),
        nn.InstanceNorm2d(16, affine=True),
    ).eval()


def test_timm_attention_blocks_and_instance_norm() -> None:
    model = _timm_attention_stack()
    for module in model.modules():  # non-trivial affine and fusion weights
        if isinstance(module, (nn.InstanceNorm2d, GlobalContext)):
            for p in module.parameters():
                nn.init.normal_(p, std=0.5)
    reference = copy.deepcopy(model)
    converted = convert_tlc(model, TRAIN)
    windows = local_windows(converted)
    assert len(windows) == 10  # SE avg+max, ESE avg, CBAM 2 x (avg+max), GC attn, GC mean, IN
    assert list(reference.state_dict()) == list(converted.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(converted(_images(TRAIN)), reference(_images(TRAIN)), atol=1e-5, rtol=0)
        out = converted(_images(2 * TRAIN))
    assert torch.isfinite(out).all() and not torch.allclose(out, reference(_images(2 * TRAIN)), atol=1e-4)


def test_local_instance_norm_equals_windowed_moments() -> None:
    torch.manual_seed(0)
    norm = nn.InstanceNorm2d(4, affine=True)
    nn.init.normal_(norm.weight), nn.init.normal_(norm.bias)
    model = nn.Sequential(norm).eval()
    convert_tlc(model, 8, example_input=torch.randn(1, 4, 8, 8))
    x = torch.randn(2, 4, 16, 16) * 3 + 5
    k = model[0].tlc_pool.kernel_size
    assert k == (12, 12)
    mean = _brute_local_mean(x, k)
    var = _brute_local_mean(x * x, k) - mean**2
    expected = (x - mean) / torch.sqrt(var + norm.eps) * norm.weight[:, None, None] + norm.bias[:, None, None]
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected, atol=1e-4, rtol=1e-4)


def _channel_conv(y: torch.Tensor, weight: torch.Tensor, circular: bool) -> torch.Tensor:
    """ECA's 1-D convolution across the channels of ``y [B, C, H, W]``, as an explicit sum of shifted
    copies: ``out[c] = sum_j weight[j] * y[c + j - pad]`` (zero or circular padding over channels)."""
    pad = (weight.numel() - 1) // 2
    if circular:
        padded = torch.cat([y[:, -pad:], y, y[:, :pad]], dim=1)
    else:
        padded = F.pad(y, (0, 0, 0, 0, pad, pad))
    return sum(w * padded[:, j:j + y.shape[1]] for j, w in enumerate(weight.flatten()))


@pytest.mark.parametrize("block", ["eca", "ceca", "se_channels_last"])
def test_eca_and_channels_last_se_become_local(block: str) -> None:
    torch.manual_seed(0)
    channels = 32
    module = {"eca": lambda: EcaModule(channels), "ceca": lambda: CecaModule(channels),
              "se_channels_last": lambda: SqueezeExciteCl(channels)}[block]().eval()
    for p in module.parameters():  # far from the default init, so the gate varies with its input
        nn.init.normal_(p, std=0.5)
    reference = copy.deepcopy(module)
    channels_last = block == "se_channels_last"
    size = 8

    def as_input(x: torch.Tensor) -> torch.Tensor:  # [B, C, H, W] -> what the block takes
        return x.permute(0, 2, 3, 1) if channels_last else x

    converted = convert_tlc(module, size, example_input=as_input(torch.randn(1, channels, size, size)))
    (window,) = local_windows(converted).values()
    assert window == (12, 12)
    x = torch.randn(2, channels, size, size)
    with torch.no_grad():
        torch.testing.assert_close(converted(as_input(x)), reference(as_input(x)), atol=1e-5, rtol=0)
        big = torch.randn(2, channels, 2 * size, 2 * size)
        out = converted(as_input(big))
    local = _brute_local_mean(big, window)
    if channels_last:
        gate = reference.fc2(reference.fc1(local.permute(0, 2, 3, 1)).relu()).sigmoid()
        expected = big.permute(0, 2, 3, 1) * gate
    else:
        expected = big * _channel_conv(local, reference.conv.weight, circular=block == "ceca").sigmoid()
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_eca_resnet_converted_and_identical_at_training_size() -> None:
    torch.manual_seed(0)
    model = VPRModel(TimmBackbone("ecaresnet26t", out_indices=(3,)), GeM).eval()
    reference = copy.deepcopy(model)
    converted = convert_tlc(model, TRAIN)
    assert sum(type(m).__name__ == "_LocalEcaModule" for m in converted.modules()) == 6  # layer1-3: 2+2+2 blocks
    with torch.no_grad():
        torch.testing.assert_close(converted(_images(TRAIN)), reference(_images(TRAIN)), atol=1e-5, rtol=0)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="base_ratio"):
        convert_tlc(_se_model(), TRAIN, base_ratio=0.5)
    assert not any(isinstance(m, LocalWindow) for m in _se_model().modules())
