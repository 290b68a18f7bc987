"""CricaVPR's multi-scale convolution-enhanced adapters inside a frozen ViT.

F. Lu, X. Lan, L. Zhang, D. Jiang, Y. Wang, C. Yuan, "CricaVPR: Cross-image Correlation-aware
Representation Learning for Visual Place Recognition", CVPR 2024, arXiv:2402.19231. Original code:
Lu-Feng/CricaVPR ``backbone/dinov2/block.py`` (``MulConvAdapter``, ``Block.forward``) and ``train.py``
(freezing, initialisation) (MIT); re-implemented from them, no code taken.

In every block, beside the MLP: ``x <- x + ls2(MLP(n) + 0.2 * A(n))``, ``n = norm2(x)``, with

    h = ReLU(fc1(n))                                   fc1: C -> C/2
    patches of h as a map -> concat(Conv-BN-ReLU branches:
        1x1 -> C/4 | 1x1 -> C/32, 3x3 -> C/8 | 1x1 -> C/32, 5x5 -> C/8)    (C/2 channels in all)
    A(n) = fc2(concat(prefix tokens of h, branch outputs) + h)                fc2: C/2 -> C

so the prefix tokens (upstream: the CLS token) pass as ``2 h`` and each patch as ``h + conv(h)``.
At C = 768 the widths are upstream's ``MulConvAdapter(768, 384, 192, 24, 96, 24, 96)``; batch norms
use ``eps = 1e-3``. Initialisation as upstream's ``train.py``: ``fc2 = 0`` (the adapted ViT starts
as the pretrained one) and every convolution's weight and bias 1e-5. Only the adapters train.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aggzoo.models.backbones.block_adapters import AdaptedViT, attention_output, layer_scale

__all__ = ["MultiConvAdapter", "MultiConvAdapterViT"]


class _ConvBNReLU(nn.Module):
    # Upstream's BasicConv2d: names conv, bn.
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)
        self.bn = nn.BatchNorm2d(out_channels, eps=1e-3)

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(self.bn(self.conv(x)))


class MultiConvAdapter(nn.Module):
    """``n: [B, P + h*w, C] -> [B, P + h*w, C]`` (see the module docstring); ``C`` a multiple of 32.

    State-dict names are upstream's: ``D_fc1``, ``D_fc2``, ``branch1.{conv,bn}``,
    ``branch{2,3}.{0,1}.{conv,bn}``.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        if dim % 32:
            raise ValueError(f"MultiConvAdapter's branch widths are C/4, C/32 and C/8: C must be a multiple of 32, got {dim}")
        hidden, reduced = dim // 2, dim // 32
        self.D_fc1 = nn.Linear(dim, hidden)
        self.branch1 = _ConvBNReLU(hidden, dim // 4, 1)
        self.branch2 = nn.Sequential(_ConvBNReLU(hidden, reduced, 1), _ConvBNReLU(reduced, dim // 8, 3))
        self.branch3 = nn.Sequential(_ConvBNReLU(hidden, reduced, 1), _ConvBNReLU(reduced, dim // 8, 5))
        self.D_fc2 = nn.Linear(hidden, dim)
        nn.init.zeros_(self.D_fc2.weight)
        nn.init.zeros_(self.D_fc2.bias)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.constant_(module.weight, 1e-5)
                nn.init.constant_(module.bias, 1e-5)

    def forward(self, x: Tensor, grid: tuple[int, int], num_prefix: int) -> Tensor:
        h = F.relu(self.D_fc1(x))
        batch, _, hidden = h.shape
        patches = h[:, num_prefix:].transpose(1, 2).reshape(batch, hidden, *grid)  # row-major positions
        conv = torch.cat([self.branch1(patches), self.branch2(patches), self.branch3(patches)], dim=1)
        out = torch.cat([h[:, :num_prefix], conv.flatten(2).transpose(1, 2)], dim=1) + h
        return self.D_fc2(out)


class MultiConvAdapterViT(AdaptedViT):
    """A frozen timm ViT with one :class:`MultiConvAdapter` beside each block's MLP (CricaVPR).

    Args:
        model_name: a timm ViT (CricaVPR: ``vit_base_patch14_dinov2``).
        adapter_scale: the factor of the adapter branch (upstream 0.2).
        pretrained: load the ViT's pretrained weights.
        frozen_stages: ``None`` (upstream): the whole ViT frozen; see :class:`AdaptedViT`.
        **model_kwargs: passed to ``timm.create_model``.

    Shapes: ``x: [B, 3, H, W] -> Features(maps=([B, C, H/p, W/p],), cls=[B, C])``. Adapters are
    ``self.adapters.{i}`` (upstream ``backbone.blocks.{i}.adapter``).
    """

    def __init__(self, model_name: str, *, adapter_scale: float = 0.2, pretrained: bool = False,
                 frozen_stages: int | None = None, **model_kwargs: Any) -> None:
        super().__init__(model_name, pretrained=pretrained, frozen_stages=frozen_stages, **model_kwargs)
        self.adapter_scale = adapter_scale
        self.adapters = nn.ModuleList(MultiConvAdapter(self.out_channels) for _ in self.model.blocks)

    def adapted_block(self, index: int, block: nn.Module, x: Tensor, rope: Tensor | None,
                      grid: tuple[int, int]) -> Tensor:
        x = x + block.drop_path1(layer_scale(block, 1, attention_output(block, x, rope)))
        normed = block.norm2(x)
        side = self.adapters[index](normed, grid, self.model.num_prefix_tokens)
        return x + block.drop_path2(layer_scale(block, 2, block.mlp(normed) + self.adapter_scale * side))
