"""Local (windowed) versions of global pooling operators, for test-time local conversion (TLC).

X. Chu, L. Chen, C. Chen, X. Lu, "Improving Image Restoration by Revisiting Global Information
Aggregation", ECCV 2022, arXiv:2112.04491. Original code: megvii-research/TLC
``basicsr/models/archs/local_arch.py`` (no licence file found); re-implemented from the paper,
the code was read only to check the window size rule and the padding.

Every operator here maps ``x: [B, C, H, W]`` to a ``[B, C, H, W]`` map whose value at ``(i, j)`` is
the statistic (mean, max, softmax-weighted mean) over a ``k_h x k_w`` window of real pixels. The
window is clamped inside the image: the stride-1 "valid" result of size ``(H-k_h+1, W-k_w+1)`` is
padded back to ``H x W`` by replicating its border (TLC's ``auto_pad``). When the window covers the
whole map the operator returns the global statistic ``[B, C, 1, 1]``, which broadcasts exactly
like the map would, so a converted network at its training size computes what it did before.

Window sums use integral images (two ``cumsum``), computed in fp32 whatever the input dtype:
a bf16/fp16 cumulative sum loses every digit after a few hundred terms.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["LocalAvgPool2d", "LocalMaxPool2d", "LocalSoftmaxPool2d", "LocalWindow", "local_mean", "local_max"]


def _window(x: Tensor, kernel_size: tuple[int, int]) -> tuple[int, int] | None:
    """The window clipped to the map, or ``None`` when it covers the whole map (global op)."""
    h, w = x.shape[-2:]
    kh, kw = min(kernel_size[0], h), min(kernel_size[1], w)
    return None if (kh, kw) == (h, w) else (kh, kw)


def _pad_to(valid: Tensor, size: tuple[int, int]) -> Tensor:
    """Replicate-pad the ``valid`` stride-1 output back to ``size``: extra rows/columns split
    floor/ceil between the top/left and bottom/right, so the window stays centred where it can."""
    dh, dw = size[0] - valid.shape[-2], size[1] - valid.shape[-1]
    if dh == 0 and dw == 0:
        return valid
    return F.pad(valid, (dw // 2, dw - dw // 2, dh // 2, dh - dh // 2), mode="replicate")


def local_mean(x: Tensor, kernel_size: tuple[int, int]) -> Tensor:
    """Mean of ``x [B, C, H, W]`` over ``k_h x k_w`` windows clamped inside the map, fp32.

    Returns ``[B, C, H, W]``, or the global mean ``[B, C, 1, 1]`` when the window covers the map.
    Equal to ``F.avg_pool2d(x, k, stride=1)`` replicate-padded back to ``H x W``.
    """
    with torch.autocast(device_type=x.device.type, enabled=False):
        x = x.float()
        centre = x.mean(dim=(-2, -1), keepdim=True)
        window = _window(x, kernel_size)
        if window is None:
            return centre
        kh, kw = window
        # Integrating x - mean instead of x keeps the partial sums near zero, so the four-corner
        # difference below does not cancel large numbers.
        s = F.pad((x - centre).cumsum(-1).cumsum(-2), (1, 0, 1, 0))
        box = s[..., kh:, kw:] - s[..., :-kh, kw:] - s[..., kh:, :-kw] + s[..., :-kh, :-kw]
        return _pad_to(box / (kh * kw) + centre, x.shape[-2:])


def local_max(x: Tensor, kernel_size: tuple[int, int]) -> Tensor:
    """Max of ``x [B, C, H, W]`` over the same clamped windows as :func:`local_mean`.

    The max is separable (rows, then columns), so the cost is ``O(k_h + k_w)`` per pixel.
    """
    window = _window(x, kernel_size)
    if window is None:
        return x.amax(dim=(-2, -1), keepdim=True)
    kh, kw = window
    valid = F.max_pool2d(F.max_pool2d(x, (kh, 1), stride=1), (1, kw), stride=1)
    return _pad_to(valid, x.shape[-2:])


class LocalWindow(nn.Module):
    """Base of the local operators: holds the window size, set by :func:`aggzoo.models.tlc.convert_tlc`
    from one calibration forward at the training size. No parameters, no buffers, so replacing a
    global operator by a local one leaves a state_dict unchanged."""

    def __init__(self, kernel_size: tuple[int, int] | None = None) -> None:
        super().__init__()
        self.kernel_size = kernel_size

    def _kernel(self) -> tuple[int, int]:
        if self.kernel_size is None:
            raise RuntimeError(
                f"{type(self).__name__} has no window size yet: it is set by "
                "aggzoo.models.tlc.convert_tlc(model, train_size) from a forward at the training size"
            )
        return self.kernel_size

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}"


class LocalAvgPool2d(LocalWindow):
    """Local stand-in for ``AdaptiveAvgPool2d(1)`` / ``x.mean((2, 3), keepdim=True)``:
    ``[B, C, H, W] -> [B, C, H, W]`` (or ``[B, C, 1, 1]`` when the window covers the map)."""

    def forward(self, x: Tensor) -> Tensor:
        return local_mean(x, self._kernel()).to(x.dtype)


class LocalMaxPool2d(LocalWindow):
    """Local stand-in for ``AdaptiveMaxPool2d(1)``: the max over the same windows as the mean."""

    def forward(self, x: Tensor) -> Tensor:
        return local_max(x, self._kernel())


class LocalSoftmaxPool2d(LocalWindow):
    """Local stand-in for softmax attention pooling (GCNet's context modelling):
    ``context(p) = sum_{q in window(p)} exp(a_q) x_q / sum_{q in window(p)} exp(a_q)``.

    ``x: [B, C, H, W]``, ``logits a: [B, 1, H, W] -> [B, C, H, W]``. Weights are ``exp(a - max a)``
    with the image's max, in fp32; a window whose logits all lie more than ~87 below that max would
    underflow, and its denominator is floored at the smallest normal float instead of dividing by 0.
    """

    def forward(self, x: Tensor, logits: Tensor) -> Tensor:
        kernel = self._kernel()
        with torch.autocast(device_type=x.device.type, enabled=False):
            a = logits.float()
            weights = (a - a.amax(dim=(-2, -1), keepdim=True)).exp()
            num = local_mean(weights * x.float(), kernel)
            den = local_mean(weights, kernel).clamp_min(torch.finfo(torch.float32).tiny)
            return (num / den).to(x.dtype)
