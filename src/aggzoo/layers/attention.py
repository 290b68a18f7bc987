"""Attention layers used by the aggregation heads: AFA's spatial and channel attention and its
multi-level compositing, GCNet's global-context block, PatchConvNet's class-attention pooling.

- AFA: Y.-H. Yang, T. E. Huang, M. Sun, S. Rota Bulo, P. Kontschieder, F. Yu, "Dense Prediction
  with Attentive Feature Aggregation", WACV 2023, arXiv:2111.00770. Original code: SysCV/dla-afa
  ``afa/model/utils/attn_utils.py``, ``afa/model/necks/afa_dla_up.py`` (no licence file found).
- GCNet: Y. Cao, J. Xu, S. Lin, F. Wei, H. Hu, "GCNet: Non-local Networks Meet Squeeze-Excitation
  Networks and Beyond", ICCVW 2019, arXiv:1904.11492. Original code: xvjiarui/GCNet
  ``mmdet/ops/*/context_block.py`` (an mmdetection fork; no licence file found).
- Class attention: H. Touvron, M. Cord, A. El-Nouby, P. Bojanowski, A. Joulin, G. Synnaeve,
  H. Jegou, "Augmenting Convolutional networks with attention-based aggregation", arXiv:2112.13692.
  Original code: facebookresearch/deit ``patchconvnet_models.py`` (CC BY-NC 4.0 in the version read).

Re-implemented from the papers; the upstream code was read only to check defaults and layouts.
Every global pooling here is a named module (``nn.AdaptiveAvgPool2d(1)``, ``nn.AdaptiveMaxPool2d(1)``,
:class:`SoftmaxPool2d`) so :func:`aggzoo.models.tlc.convert_tlc` can swap it for a local window.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "SpatialAttention",
    "ChannelAttention",
    "composite_weights",
    "SoftmaxPool2d",
    "ChannelLayerNorm",
    "GlobalContextBlock",
    "ClassAttentionPool",
]


class SpatialAttention(nn.Module):
    """AFA spatial attention: ``s = sigmoid(Conv1x1(ReLU(BN(Conv3x3(ReLU(BN(Conv3x3(x))))))))``.

    ``x: [B, C, H, W] -> s: [B, 1, H, W]`` in (0, 1). ``hidden`` is the bottleneck width of the two
    3x3 convolutions (upstream: the fused width itself, 32-256 channels on DLA-34).
    """

    def __init__(self, in_channels: int, *, hidden: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, hidden, 3, padding=1, bias=False),
            nn.BatchNorm2d(hidden),
            nn.ReLU(inplace=True),
            nn.Conv2d(hidden, hidden, 3, padding=1, bias=False),
            nn.BatchNorm2d(hidden),
            nn.ReLU(inplace=True),
            nn.Conv2d(hidden, 1, 1, bias=False),
        )

    def forward(self, x: Tensor) -> Tensor:
        return torch.sigmoid(self.body(x))


class ChannelAttention(nn.Module):
    """AFA (CBAM-style) channel attention: ``c = sigmoid(MLP(avgpool(x)) + MLP(maxpool(x)))``,
    one MLP ``C -> C/r -> C`` (1x1 convolutions, ReLU) shared by both pooled vectors.

    ``x: [B, C, H, W] -> c: [B, C, 1, 1]`` (``[B, C, H, W]`` once TLC made the pools local).
    Upstream puts a BatchNorm after the first 1x1 convolution; this follows the paper's plain MLP,
    because one BatchNorm shared by the avg and max paths keeps running statistics of two different
    distributions, and fails on a training batch of one.
    """

    def __init__(self, channels: int, *, reduction: int = 16) -> None:
        super().__init__()
        hidden = max(1, channels // reduction)
        self.avg_pool = nn.AdaptiveAvgPool2d(1)
        self.max_pool = nn.AdaptiveMaxPool2d(1)
        self.mlp = nn.Sequential(
            nn.Conv2d(channels, hidden, 1, bias=False),
            nn.ReLU(inplace=True),
            nn.Conv2d(hidden, channels, 1, bias=False),
        )

    def forward(self, x: Tensor) -> Tensor:
        return torch.sigmoid(self.mlp(self.avg_pool(x)) + self.mlp(self.max_pool(x)))


def composite_weights(attentions: Sequence[Tensor]) -> list[Tensor]:
    """AFA's multi-level compositing: ``a_i = s_i * prod_{j > i} (1 - s_j)``.

    ``attentions`` are ordered from the first-composited level to the last, each in [0, 1]; the
    last one is "on top" and keeps its full weight, each earlier one gets what the later ones leave.
    The weights sum to ``1 - prod_j (1 - s_j) <= 1``.
    """
    weights: list[Tensor] = []
    remaining: Tensor | float = 1.0
    for s in reversed(attentions):
        weights.append(s * remaining)
        remaining = remaining * (1 - s)
    return weights[::-1]


class SoftmaxPool2d(nn.Module):
    """Attention pooling: ``context = sum_i softmax_i(a) x_i`` over the H*W positions.

    ``x: [B, C, H, W]``, ``logits a: [B, 1, H, W] -> [B, C, 1, 1]``. Computed in fp32 (the
    softmax over a few thousand positions is where bf16 loses most).
    """

    def forward(self, x: Tensor, logits: Tensor) -> Tensor:
        with torch.autocast(device_type=x.device.type, enabled=False):
            weights = logits.float().flatten(2).softmax(dim=-1)  # [B, 1, HW]
            context = torch.matmul(x.float().flatten(2), weights.transpose(1, 2))  # [B, C, 1]
        return context[..., None].to(x.dtype)


class ChannelLayerNorm(nn.Module):
    """LayerNorm over the channel axis at every position of ``[B, C, H, W]``.

    Parameters have upstream GCNet's shape ``[C, 1, 1]`` (its ``nn.LayerNorm([C, 1, 1])``, applied
    there to a ``[B, C, 1, 1]`` context), so its weights load; unlike that layer, this one also
    works on a per-position context map, which is what TLC's local context is.
    """

    def __init__(self, channels: int, *, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels, 1, 1))
        self.bias = nn.Parameter(torch.zeros(channels, 1, 1))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        # torch's fused layer_norm over the channel axis (moved last): one kernel and one saved
        # tensor, where mean/var/scale written out keep four activations for backward.
        channels = x.shape[1]
        y = F.layer_norm(x.movedim(1, -1), (channels,), self.weight.view(channels), self.bias.view(channels), self.eps)
        return y.movedim(-1, 1)


class GlobalContextBlock(nn.Module):
    """GCNet global-context block (attention pooling, channel-add fusion):
    ``y = x + W2 ReLU(LN(W1 sum_j softmax_j(W_k x) x_j))``.

    ``x: [B, C, H, W] -> [B, C, H, W]``; ``planes = C * ratio`` (paper: r = 16). ``W2`` is zero
    initialised, so a fresh block is exactly the identity. state_dict keys follow upstream
    (``conv_mask``, ``channel_add_conv.{0,1,3}``).
    """

    def __init__(self, channels: int, *, ratio: float = 1 / 16) -> None:
        super().__init__()
        planes = max(1, int(channels * ratio))
        self.conv_mask = nn.Conv2d(channels, 1, 1)
        self.pool = SoftmaxPool2d()
        self.channel_add_conv = nn.Sequential(
            nn.Conv2d(channels, planes, 1),
            ChannelLayerNorm(planes),
            nn.ReLU(inplace=True),
            nn.Conv2d(planes, channels, 1),
        )
        nn.init.kaiming_normal_(self.conv_mask.weight, mode="fan_in", nonlinearity="relu")
        nn.init.zeros_(self.conv_mask.bias)
        nn.init.zeros_(self.channel_add_conv[3].weight)
        nn.init.zeros_(self.channel_add_conv[3].bias)

    def forward(self, x: Tensor) -> Tensor:
        context = self.pool(x, self.conv_mask(x))
        return x + self.channel_add_conv(context)


class _ClassAttention(nn.Module):
    """Single-query attention: the CLS token (row 0 of ``u``) queries every row of ``u``."""

    def __init__(self, dim: int, *, num_heads: int, qkv_bias: bool) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"class attention: channels {dim} must be divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.k = nn.Linear(dim, dim, bias=qkv_bias)
        self.v = nn.Linear(dim, dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def _split_heads(self, t: Tensor) -> Tensor:
        b, n, c = t.shape
        return t.view(b, n, self.num_heads, c // self.num_heads).transpose(1, 2)

    def forward(self, u: Tensor) -> Tensor:
        """``u: [B, N, C] -> [B, 1, C]`` (scale ``head_dim ** -0.5``, softmax over the N rows)."""
        q, k, v = (self._split_heads(t) for t in (self.q(u[:, :1]), self.k(u), self.v(u)))
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(u.shape[0], 1, u.shape[2]))


class _Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))


class ClassAttentionPool(nn.Module):
    """PatchConvNet's attention-based aggregation (one class-attention block, then LayerNorm).

    ``x: [B, N, C] -> [B, C]``: with a learned query token ``cls [1, 1, C]``,
    ``u = LN1([cls; x])``, ``cls <- cls + gamma_1 * CA(u)`` (CA: the CLS row attends over every
    row of ``u``), ``cls <- cls + gamma_2 * MLP(LN2(cls))`` (hidden ``mlp_ratio * C``, GELU), output
    ``LN(cls)``. ``gamma_1``, ``gamma_2`` are layer-scale vectors initialised to ``init_scale``.
    Defaults are the paper's (1 head, MLP ratio 3, layer scale 1e-6, qkv bias, LayerNorm eps 1e-6).
    """

    def __init__(
        self,
        dim: int,
        *,
        num_heads: int = 1,
        mlp_ratio: float = 3.0,
        init_scale: float = 1e-6,
        qkv_bias: bool = True,
        eps: float = 1e-6,
    ) -> None:
        super().__init__()
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.attn = _ClassAttention(dim, num_heads=num_heads, qkv_bias=qkv_bias)
        self.gamma_1 = nn.Parameter(torch.full((dim,), float(init_scale)))
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = _Mlp(dim, int(dim * mlp_ratio))
        self.gamma_2 = nn.Parameter(torch.full((dim,), float(init_scale)))
        self.norm = nn.LayerNorm(dim, eps=eps)
        # Upstream initialisation: truncated normal (std 0.02) for the token and every Linear.
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def forward(self, x: Tensor) -> Tensor:
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        cls = cls + self.gamma_1 * self.attn(self.norm1(torch.cat((cls, x), dim=1)))
        cls = cls + self.gamma_2 * self.mlp(self.norm2(cls))
        return self.norm(cls[:, 0])
