"""SelaVPR's global adaptation: a serial and a parallel adapter inside every block of a frozen ViT.

F. Lu, L. Zhang, X. Lan, S. Dong, Y. Wang, C. Yuan, "Towards Seamless Adaptation of Pre-trained
Models for Visual Place Recognition" (SelaVPR), ICLR 2024, arXiv:2402.14505. Original code:
Lu-Feng/SelaVPR ``backbone/dinov2/block.py`` (``Adapter``, ``Block.forward``) and ``train.py``
(freezing, initialisation) (MIT); re-implemented from them, no code taken.

Every block becomes

    x <- x + ls1(A1(attn(norm1(x))))             A1(a) = a + fc2(ReLU(fc1(a)))   (serial, with skip)
    x <- x + ls2(MLP(n) + 0.2 * A2(n)), n = norm2(x)   A2(n) = fc2(ReLU(fc1(n)))  (parallel, no skip)

with ``fc1: C -> C/2``, ``fc2: C/2 -> C``, both ``fc2`` zero at initialisation (upstream ``train.py``), so
the adapted ViT starts as the pretrained one. Only the adapters train.
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from aggzoo.models.backbones.block_adapters import AdaptedViT, attention_output, layer_scale

__all__ = ["BottleneckAdapter", "SelaAdapterViT", "SelaBlockAdapters"]


class BottleneckAdapter(nn.Module):
    """``x -> [x +] fc2(ReLU(fc1(x)))`` on ``[B, N, C]``; ``fc1: C -> ratio C``; ``fc2`` starts at zero.
    Names are upstream's (``D_fc1``, ``D_fc2``)."""

    def __init__(self, dim: int, *, ratio: float = 0.5, skip: bool = True) -> None:
        super().__init__()
        self.skip = skip
        self.D_fc1 = nn.Linear(dim, int(dim * ratio))
        self.D_fc2 = nn.Linear(int(dim * ratio), dim)
        nn.init.zeros_(self.D_fc2.weight)
        nn.init.zeros_(self.D_fc2.bias)

    def forward(self, x: Tensor) -> Tensor:
        out = self.D_fc2(F.relu(self.D_fc1(x)))
        return x + out if self.skip else out


class SelaBlockAdapters(nn.Module):
    """The two adapters of one block: ``adapter1`` (serial, after the attention) and ``adapter2``
    (parallel to the MLP)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.adapter1 = BottleneckAdapter(dim, skip=True)
        self.adapter2 = BottleneckAdapter(dim, skip=False)


class SelaAdapterViT(AdaptedViT):
    """A frozen timm ViT with SelaVPR's two adapters in each block (see the module docstring).

    Args:
        model_name: a timm ViT (SelaVPR: ``vit_large_patch14_dinov2``, or ``..._reg4_dinov2``).
        adapter_scale: the factor of the parallel adapter (upstream 0.2).
        pretrained: load the ViT's pretrained weights.
        frozen_stages: ``None`` (upstream): the whole ViT frozen; see :class:`AdaptedViT`.
        **model_kwargs: passed to ``timm.create_model``.

    Shapes: ``x: [B, 3, H, W] -> Features(maps=([B, C, H/p, W/p],), cls=[B, C])``. Adapters are
    ``self.adapters.{i}.adapter{1,2}`` (upstream ``backbone.blocks.{i}.adapter{1,2}``).
    """

    def __init__(self, model_name: str, *, adapter_scale: float = 0.2, pretrained: bool = False,
                 frozen_stages: int | None = None, **model_kwargs: Any) -> None:
        super().__init__(model_name, pretrained=pretrained, frozen_stages=frozen_stages, **model_kwargs)
        self.adapter_scale = adapter_scale
        self.adapters = nn.ModuleList(SelaBlockAdapters(self.out_channels) for _ in self.model.blocks)

    def adapted_block(self, index: int, block: nn.Module, x: Tensor, rope: Tensor | None,
                      grid: tuple[int, int]) -> Tensor:
        adapters = self.adapters[index]
        x = x + block.drop_path1(layer_scale(block, 1, adapters.adapter1(attention_output(block, x, rope))))
        normed = block.norm2(x)
        mlp = block.mlp(normed) + self.adapter_scale * adapters.adapter2(normed)
        return x + block.drop_path2(layer_scale(block, 2, mlp))
