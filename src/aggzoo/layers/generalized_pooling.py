"""Generalized pooling functions: mixed, gated and tree pooling of local windows.

C.-Y. Lee, P. W. Gallagher, Z. Tu, "Generalizing Pooling Functions in Convolutional Neural Networks:
Mixed, Gated, and Tree", AISTATS 2016, arXiv:1509.08985 (no code read; built from the paper). Drop-in
replacements for a network's ``k x k`` max / average downsampling layers, with the paper's
per-layer parameters (shared across channels; for 3x3 windows 1, 9 and 27 parameters):

- mixed max-average: ``f(x) = a max(x) + (1 - a) avg(x)``, one ``a`` in [0, 1] per layer;
- gated max-average: ``f(x) = s max(x) + (1 - s) avg(x)``, ``s = sigmoid(w . x)``, a learned ``k x k``
  gating mask ``w`` applied to each channel's window ``x``;
- tree: a binary tree of ``levels`` levels whose ``2^(levels-1)`` leaves are learned pooling filters
  ``v_m . x`` and whose internal nodes mix their children with a gate ``sigmoid(w_n . x)``; the
  2-level tree is ``s v_1 . x + (1 - s) v_2 . x``.

``x`` is every ``k x k`` window of one channel, taken with the replaced layer's stride and padding
(max ignores padded positions; the average counts them as the replaced layer did, the filters see zeros;
``ceil_mode`` windows past the input end likewise).
Shapes: ``[B, C, H, W] -> [B, C, H', W']`` with the replaced layer's output size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["GatedPool2d", "MixedPool2d", "TreePool2d", "WindowPool2d"]


def _pair(value: int | tuple[int, int]) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))


class WindowPool2d(nn.Module):
    """Shared window geometry (kernel, stride, padding) and the per-channel window filters.

    Args:
        kernel_size, stride, padding, ceil_mode: as ``nn.MaxPool2d`` (stride defaults to the kernel size).
        count_include_pad: whether the average counts padded zeros (``nn.AvgPool2d``'s flag).
    """

    def __init__(self, kernel_size: int | tuple[int, int], stride: int | tuple[int, int] | None = None,
                 padding: int | tuple[int, int] = 0, *, count_include_pad: bool = True, ceil_mode: bool = False) -> None:
        super().__init__()
        self.kernel_size = _pair(kernel_size)
        self.stride = _pair(stride if stride is not None else kernel_size)
        self.padding = _pair(padding)
        self.count_include_pad = count_include_pad
        self.ceil_mode = ceil_mode

    def max(self, x: Tensor) -> Tensor:
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding, ceil_mode=self.ceil_mode)

    def avg(self, x: Tensor) -> Tensor:
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding, ceil_mode=self.ceil_mode,
                            count_include_pad=self.count_include_pad)

    def _output_size(self, size: int, axis: int) -> int:
        """Windows along one axis, by torch's pooling rule (with ``ceil_mode``, a last window must start
        inside the input or its left padding)."""
        k, s, p = self.kernel_size[axis], self.stride[axis], self.padding[axis]
        span = size + 2 * p - k
        out = (-(-span // s) if self.ceil_mode else span // s) + 1
        if self.ceil_mode and (out - 1) * s >= size + p:
            out -= 1
        return out

    def filters(self, x: Tensor, weights: Tensor) -> Tensor:
        """``w_f . x`` for each of ``F`` window filters ``weights [F, k, k]``, every channel alike:
        ``[B, C, H, W] -> [B, C, F, H', W']`` (one convolution of the channels folded into the batch),
        on the windows max / avg pool (zeros beyond the input)."""
        b, c, h, w = x.shape
        (kh, kw), (sh, sw), (ph, pw) = self.kernel_size, self.stride, self.padding
        extra_h = max(0, (self._output_size(h, 0) - 1) * sh + kh - (h + 2 * ph))
        extra_w = max(0, (self._output_size(w, 1) - 1) * sw + kw - (w + 2 * pw))
        padded = F.pad(x.reshape(b * c, 1, h, w), (pw, pw + extra_w, ph, ph + extra_h))
        out = F.conv2d(padded, weights[:, None].to(x.dtype), stride=self.stride)
        return out.view(b, c, weights.shape[0], *out.shape[-2:])

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class MixedPool2d(WindowPool2d):
    """``a max(x) + (1 - a) avg(x)``; ``a`` starts at ``mix`` (1: exactly max pooling, 0: average)."""

    def __init__(self, *args: object, mix: float = 0.5, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.mix = nn.Parameter(torch.tensor(float(mix)))

    def forward(self, x: Tensor) -> Tensor:
        a = self.mix.clamp(0.0, 1.0)  # the paper's a in [0, 1]; clamp keeps the gradient inside the range
        return a * self.max(x) + (1 - a) * self.avg(x)


class GatedPool2d(WindowPool2d):
    """``s max(x) + (1 - s) avg(x)``, ``s = sigmoid(w . x)`` per window; ``w`` starts at zero (s = 1/2)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.gate = nn.Parameter(torch.zeros(1, *self.kernel_size))

    def forward(self, x: Tensor) -> Tensor:
        s = torch.sigmoid(self.filters(x, self.gate)[:, :, 0])
        return s * self.max(x) + (1 - s) * self.avg(x)


class TreePool2d(WindowPool2d):
    """Tree pooling with ``levels`` levels (paper: 2 and 3).

    Leaves (``2^(levels-1)`` filters, ``leaves[m]``) start as the averaging filter plus a little noise
    (identical leaves would get identical gradients and the gates none); gates (``2^(levels-1) - 1``,
    heap order: node ``n`` mixes children ``2n+1`` and ``2n+2``) start at zero. So a fresh tree is
    close to average pooling.
    """

    def __init__(self, *args: object, levels: int = 2, noise: float = 1e-2, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        if levels < 2:
            raise ValueError(f"tree pooling needs at least 2 levels, got {levels}")
        self.levels = levels
        kh, kw = self.kernel_size
        leaves = 2 ** (levels - 1)
        self.leaves = nn.Parameter(torch.full((leaves, kh, kw), 1.0 / (kh * kw)) + noise * torch.randn(leaves, kh, kw))
        self.gates = nn.Parameter(torch.zeros(leaves - 1, kh, kw))

    def forward(self, x: Tensor) -> Tensor:
        responses = self.filters(x, torch.cat([self.gates, self.leaves]))  # [B, C, gates + leaves, H', W']
        internal = self.gates.shape[0]
        gates = torch.sigmoid(responses[:, :, :internal])
        nodes: list[Tensor | None] = [None] * internal + list(responses[:, :, internal:].unbind(dim=2))  # heap order
        for n in reversed(range(internal)):  # bottom-up: children 2n+1, 2n+2 are done before n
            nodes[n] = gates[:, :, n] * nodes[2 * n + 1] + (1 - gates[:, :, n]) * nodes[2 * n + 2]
        return nodes[0]
