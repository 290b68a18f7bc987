"""SAGE's parameter-efficient DINOv2: a frozen ViT whose last blocks' outputs go through a dynamic power norm.

S. Chen et al., "SAGE: Spatial-visual Adaptive Graph Exploration for Efficient Visual Place
Recognition", ICLR 2026, arXiv:2509.25723. Original code: chenshunpeng/SAGE ``backbone/dinov2_sage.py``
(MIT), configured by ``network.py`` (``num_recalib_blocks=4``, ``num_trainable_blocks=0``,
``recalibration='dpn_s1'``, ``norm_layer=True``); read for the computation and names only.

For each of the last ``k`` blocks (upstream ``k = 4``) the block runs unchanged and its output tokens
(class token included) go through :class:`~aggzoo.layers.power_norm.DynamicPowerNorm` (hidden width 16):
``x_i = DPN_i(block_i(x_{i-1}))``. Every ViT weight is frozen except the final LayerNorm, which
upstream trains with the ``k`` power norms (and the aggregator).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from aggzoo.layers.power_norm import DynamicPowerNorm
from aggzoo.models.backbones.block_adapters import AdaptedViT

__all__ = ["PowerRecalibratedViT"]


class PowerRecalibratedViT(AdaptedViT):
    """A frozen timm ViT with a :class:`DynamicPowerNorm` after each of its last ``recalibrated_blocks`` blocks.

    Args:
        model_name: a timm ViT (SAGE: ``vit_large_patch14_dinov2``, or ``vit_base_patch14_dinov2``).
        recalibrated_blocks: ``k``, how many final blocks are followed by a power norm (upstream 4).
        hidden_dim: hidden width of each power norm's exponent predictor (upstream 16).
        pretrained: load the ViT's pretrained weights.
        frozen_stages: ``None`` (upstream) freezes the ViT except its final norm; an integer freezes that
            many leading levels as :class:`~aggzoo.models.backbones.timm_backbone.TimmBackbone` does.
        **model_kwargs: passed to ``timm.create_model`` (``img_size``, ``dynamic_img_size``, ``depth``...).

    Shapes: ``x: [B, 3, H, W] -> Features(maps=([B, C, H/p, W/p],), cls=[B, C])``, after the final norm.
    """

    def __init__(self, model_name: str, *, recalibrated_blocks: int = 4, hidden_dim: int = 16,
                 pretrained: bool = False, frozen_stages: int | None = None, **model_kwargs: Any) -> None:
        super().__init__(model_name, pretrained=pretrained, frozen_stages=frozen_stages, **model_kwargs)
        depth = len(self.model.blocks)
        if not 0 <= recalibrated_blocks <= depth:
            raise ValueError(f"recalibrated_blocks must be in [0, {depth}] for {model_name}, got {recalibrated_blocks}")
        if frozen_stages is None:  # upstream trains the final LayerNorm
            self.model.norm.requires_grad_(True)
            self._frozen_modules = [m for m in self._frozen_modules if m is not self.model.norm]
        self.first_recalibrated = depth - recalibrated_blocks
        self.recalibrations = nn.ModuleList(
            DynamicPowerNorm(self.out_channels, hidden_dim) for _ in range(recalibrated_blocks))

    def adapted_block(self, index: int, block: nn.Module, x: Tensor, rope: Tensor | None,
                      grid: tuple[int, int]) -> Tensor:
        x = super().adapted_block(index, block, x, rope, grid)
        if index < self.first_recalibrated:
            return x
        return self.recalibrations[index - self.first_recalibrated](x)
