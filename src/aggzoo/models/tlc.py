"""TLC: test-time local conversion of the global operations inside a network.

X. Chu, L. Chen, C. Chen, X. Lu, "Improving Image Restoration by Revisiting Global Information
Aggregation", ECCV 2022, arXiv:2112.04491. Original code: megvii-research/TLC
``basicsr/models/archs/local_arch.py`` (no licence file found); re-implemented from the paper.

A network trained on ``train_size`` crops and run on larger images computes its global statistics
(squeeze-excite means, global-context attention pooling, instance-norm moments) over far more
pixels than it ever did in training. TLC replaces each of them, at inference, by the same
statistic over a local window sized like the training-time map: kernel = (the layer's feature
size at ``train_size``) x ``base_size / train_size``, with ``base_size = base_ratio x train_size``
(``h * base // train`` in integers, as upstream), measured by one forward at ``train_size``.

What :func:`convert_tlc` converts (exact type match, see :data:`TLC_RULES`):

- timm ``SqueezeExcite`` (EfficientNet/MobileNet/GhostNet blocks), ``SEModule`` (SE-ResNet,
  RegNet, NFNet, ByobNet...), legacy ``senet.SEModule``, ``EffectiveSEModule``, channels-last
  ``SqueezeExciteCl``: the squeeze mean (and the optional max of ``add_maxpool``);
- timm ``EcaModule`` / ``CecaModule`` (ECA-ResNet, ECA-NFNet...): the mean feeding the 1-D
  convolution across channels, which then runs on the channel vector of every position;
- timm CBAM ``ChannelAttn`` / ``LightChannelAttn``: the avg and max pools;
- timm ``GlobalContext`` and aggzoo's :class:`~aggzoo.layers.attention.GlobalContextBlock`:
  softmax attention pooling (or the mean, without attention);
- aggzoo's :class:`~aggzoo.layers.attention.ChannelAttention` (AFA): avg and max pools;
- ``nn.InstanceNorm2d`` without running statistics: local mean and variance,
  ``Var = E[x^2] - E[x]^2`` clamped at 0.

"Local max" is the max over the same window as the local mean. Everything else is left alone, in
particular any bare ``AdaptiveAvgPool2d``/GeM/``mean`` that pools the final descriptor: converting
it would feed a map, not a vector, to what follows (upstream issue #24), and a descriptor must stay
global. Weights and state_dict keys are unchanged (the local operators hold no tensors), and at
``train_size`` every window covers its whole map, so the converted model computes what the
original did. Local statistics use integral images in fp32 (:mod:`aggzoo.layers.local_pool`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from timm.layers.cbam import ChannelAttn, LightChannelAttn
from timm.layers.eca import CecaModule, EcaModule
from timm.layers.global_context import GlobalContext
from timm.layers.squeeze_excite import EffectiveSEModule, SEModule, SqueezeExciteCl
from timm.models._efficientnet_blocks import SqueezeExcite
from timm.models.senet import SEModule as LegacySEModule
from torch import Tensor, nn

from aggzoo.layers.attention import ChannelAttention, GlobalContextBlock
from aggzoo.layers.local_pool import LocalAvgPool2d, LocalMaxPool2d, LocalSoftmaxPool2d, LocalWindow
from aggzoo.models.modes import evaluating

__all__ = ["convert_tlc", "local_windows", "TLC_RULES"]


# Local versions of timm's attention blocks. Each subclass keeps the parent's submodules (so its
# state_dict is the parent's) and only redoes ``forward`` with the global pooling swapped for
# ``tlc_pool`` / ``tlc_max``; a converted instance has its class switched in place.


class _LocalSqueezeExcite(SqueezeExcite):
    def forward(self, x: Tensor) -> Tensor:
        return x * self.gate(self.conv_expand(self.act1(self.conv_reduce(self.tlc_pool(x)))))


class _LocalSEModule(SEModule):
    def forward(self, x: Tensor) -> Tensor:
        x_se = self.tlc_pool(x)
        if self.add_maxpool:
            x_se = 0.5 * x_se + 0.5 * self.tlc_max(x)
        return x * self.gate(self.fc2(self.act(self.bn(self.fc1(x_se)))))


class _LocalLegacySEModule(LegacySEModule):
    def forward(self, x: Tensor) -> Tensor:
        return x * self.sigmoid(self.fc2(self.relu(self.fc1(self.tlc_pool(x)))))


class _LocalEffectiveSEModule(EffectiveSEModule):
    def forward(self, x: Tensor) -> Tensor:
        x_se = self.tlc_pool(x)
        if self.add_maxpool:
            x_se = 0.5 * x_se + 0.5 * self.tlc_max(x)
        return x * self.gate(self.fc(x_se))


class _LocalSqueezeExciteCl(SqueezeExciteCl):
    def forward(self, x: Tensor) -> Tensor:  # x: [B, H, W, C]
        x_se = self.tlc_pool(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
        return x * self.gate(self.fc2(self.act(self.fc1(x_se))))


def _channel_conv_per_position(y: Tensor, conv: Callable[[Tensor], Tensor]) -> Tensor:
    """``[B, C, H, W] -> [B, C, H, W]``: ``conv`` (``[N, 1, C] -> [N, 1, C]``, ECA's 1-D convolution
    across channels) applied to the channel vector of every position."""
    b, c, h, w = y.shape
    y = conv(y.permute(0, 2, 3, 1).reshape(b * h * w, 1, c))
    return y.reshape(b, h, w, c).permute(0, 3, 1, 2)


class _LocalEcaModule(EcaModule):
    def forward(self, x: Tensor) -> Tensor:
        def channel_conv(y: Tensor) -> Tensor:
            y = self.conv(y)
            if self.conv2 is not None:
                y = self.conv2(self.act(y))
            return y

        return x * self.gate(_channel_conv_per_position(self.tlc_pool(x), channel_conv))


class _LocalCecaModule(CecaModule):
    def forward(self, x: Tensor) -> Tensor:
        def channel_conv(y: Tensor) -> Tensor:
            return self.conv(F.pad(y, (self.padding, self.padding), mode="circular"))

        return x * self.gate(_channel_conv_per_position(self.tlc_pool(x), channel_conv))


class _LocalChannelAttn(ChannelAttn):
    def forward(self, x: Tensor) -> Tensor:
        x_avg = self.fc2(self.act(self.fc1(self.tlc_pool(x))))
        x_max = self.fc2(self.act(self.fc1(self.tlc_max(x))))
        return x * self.gate(x_avg + x_max)


class _LocalLightChannelAttn(LightChannelAttn):
    def forward(self, x: Tensor) -> Tensor:
        x_pool = 0.5 * self.tlc_pool(x) + 0.5 * self.tlc_max(x)
        return x * torch.sigmoid(self.fc2(self.act(self.fc1(x_pool))))


class _LocalGlobalContext(GlobalContext):
    def forward(self, x: Tensor) -> Tensor:
        if self.conv_attn is not None:
            context = self.tlc_pool(x, self.conv_attn(x))
        else:
            context = self.tlc_pool(x)
        if self.mlp_scale is not None:
            x = x * self.gate(self.mlp_scale(context))
        if self.mlp_add is not None:
            x = x + self.mlp_add(context)
        return x


class _LocalInstanceNorm2d(nn.InstanceNorm2d):
    """Instance norm with local moments: ``(x - E_w[x]) / sqrt(Var_w[x] + eps)``, fp32."""

    def forward(self, x: Tensor) -> Tensor:
        with torch.autocast(device_type=x.device.type, enabled=False):
            # Centre on the global mean first: Var = E[c^2] - E[c]^2 is shift invariant, and with
            # c near zero the subtraction does not cancel two large numbers.
            c = x.float() - x.float().mean(dim=(-2, -1), keepdim=True)
            mean = self.tlc_pool(c)
            var = (self.tlc_pool(c * c) - mean * mean).clamp_min(0)
            y = (c - mean) * torch.rsqrt(var + self.eps)
            if self.affine:
                y = y * self.weight[:, None, None] + self.bias[:, None, None]
        return y.to(x.dtype)


def _switch(
    local_cls: type[nn.Module],
    pool: Callable[[], LocalWindow] = LocalAvgPool2d,
    needs_max: Callable[[nn.Module], bool] = lambda module: False,
) -> Callable[[nn.Module], None]:
    """A rule that switches a module's class to ``local_cls`` and gives it ``tlc_pool`` (and
    ``tlc_max`` where the block also max-pools)."""

    def convert(module: nn.Module) -> None:
        module.__class__ = local_cls
        module.tlc_pool = pool()
        if needs_max(module):
            module.tlc_max = LocalMaxPool2d()

    return convert


def _uses_maxpool(module: nn.Module) -> bool:
    return bool(module.add_maxpool)


def _always(module: nn.Module) -> bool:
    return True


def _convert_channel_attention(module: nn.Module) -> None:
    module.avg_pool = LocalAvgPool2d()
    module.max_pool = LocalMaxPool2d()


def _convert_gc_block(module: nn.Module) -> None:
    module.pool = LocalSoftmaxPool2d()


def _convert_timm_gc(module: nn.Module) -> None:
    pool = LocalSoftmaxPool2d if module.conv_attn is not None else LocalAvgPool2d
    _switch(_LocalGlobalContext, pool)(module)


def _convert_instance_norm(module: nn.Module) -> None:
    # With running statistics, eval-mode instance norm uses no per-image statistic: nothing to do.
    if not module.track_running_stats:
        _switch(_LocalInstanceNorm2d)(module)


#: module type (exact) -> in-place conversion. Register a block of your own here to have its
#: global pooling made local; never register the pooling that produces the descriptor.
TLC_RULES: dict[type[nn.Module], Callable[[nn.Module], None]] = {
    SqueezeExcite: _switch(_LocalSqueezeExcite),
    SEModule: _switch(_LocalSEModule, needs_max=_uses_maxpool),
    LegacySEModule: _switch(_LocalLegacySEModule),
    EffectiveSEModule: _switch(_LocalEffectiveSEModule, needs_max=_uses_maxpool),
    SqueezeExciteCl: _switch(_LocalSqueezeExciteCl),
    EcaModule: _switch(_LocalEcaModule),
    CecaModule: _switch(_LocalCecaModule),
    ChannelAttn: _switch(_LocalChannelAttn, needs_max=_always),
    LightChannelAttn: _switch(_LocalLightChannelAttn, needs_max=_always),
    GlobalContext: _convert_timm_gc,
    ChannelAttention: _convert_channel_attention,
    GlobalContextBlock: _convert_gc_block,
    nn.InstanceNorm2d: _convert_instance_norm,
}


def _pair(size: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    if isinstance(size, int):
        return size, size
    if len(size) != 2:
        raise ValueError(f"train_size must be an int or (H, W), got {size!r}")
    return int(size[0]), int(size[1])


def local_windows(model: nn.Module) -> dict[str, tuple[int, int] | None]:
    """Name -> window size of every local operator in a converted model."""
    return {name: m.kernel_size for name, m in model.named_modules() if isinstance(m, LocalWindow)}


@torch.no_grad()
def convert_tlc(
    model: nn.Module,
    train_size: int | tuple[int, int],
    base_ratio: float = 1.5,
    *,
    example_input: Any = None,
) -> nn.Module:
    """Swap the global operations inside ``model`` for local windows (in place) and return it.

    Args:
        model: any network; its converted blocks are those of :data:`TLC_RULES`.
        train_size: the training image size ``H`` or ``(H, W)``.
        base_ratio: ``base_size / train_size`` (TLC: 1.5); at least 1, so that the windows cover
            the whole map at the training size and the outputs there are unchanged.
        example_input: what the calibration forward feeds the model; default a random
            ``[1, 3, H, W]`` image batch of ``train_size`` (pass e.g. ``Features`` for a bare head,
            with ``train_size`` then the size of the map it holds).

    The calibration forward runs once, in eval mode, and sets each local window to
    ``(h * base_h // train_h, w * base_w // train_w)`` for the ``h x w`` map it sees.
    """
    if base_ratio < 1:
        raise ValueError(f"base_ratio must be >= 1 (windows at least the training map), got {base_ratio}")
    train_h, train_w = _pair(train_size)
    base_h, base_w = int(train_h * base_ratio), int(train_w * base_ratio)

    for module in list(model.modules()):
        rule = TLC_RULES.get(type(module))
        if rule is not None:
            rule(module)
    windows = {name: m for name, m in model.named_modules() if isinstance(m, LocalWindow)}
    if not windows:
        return model

    seen: dict[str, tuple[int, int]] = {}

    def calibrate(name: str, module: LocalWindow, args: tuple[Any, ...]) -> None:
        h, w = args[0].shape[-2:]
        if seen.setdefault(name, (h, w)) != (h, w):
            raise ValueError(
                f"TLC: {name} pools maps of two sizes {seen[name]} and {(h, w)} in one forward; "
                "one window size cannot serve both"
            )
        module.kernel_size = (max(1, h * base_h // train_h), max(1, w * base_w // train_w))

    hooks = [
        m.register_forward_pre_hook(lambda mod, args, name=name: calibrate(name, mod, args))
        for name, m in windows.items()
    ]
    if example_input is None:
        param = next(model.parameters(), None)
        example_input = torch.rand(
            1, 3, train_h, train_w,
            device=param.device if param is not None else None,
            dtype=param.dtype if param is not None else None,
        )
    try:
        with evaluating(model):
            model(example_input)
    finally:
        for hook in hooks:
            hook.remove()
    unreached = sorted(set(windows) - set(seen))
    if unreached:
        raise ValueError(
            f"TLC: the calibration forward at {train_size} never reached {unreached}; their window "
            "size is unknown. Pass an example_input that runs through them."
        )
    return model
