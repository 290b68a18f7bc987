"""A frozen ViT whose blocks run here, with trainable adapters inside them (CricaVPR, SelaVPR).

CricaVPR and SelaVPR change the inside of every transformer block: an adapter beside the MLP
(``x + ls2(MLP(n) + s * A(n))``, ``n = norm2(x)``) and, for SelaVPR, one after the attention
(``x + ls1(A'(attn(norm1(x))))``). timm's blocks do not expose these points, so
:class:`AdaptedViT` runs each block's own modules (``norm1``, ``attn``, layer scale, ``norm2``,
``mlp``) in the same order, which gives timm's block output exactly when the adapters add nothing,
and lets a subclass insert its adapters through :meth:`AdaptedViT.adapted_block`.

Both timm ViT families work: ``VisionTransformer`` (DINOv2: layer scale ``ls1``/``ls2``, additive
positions) and ``Eva`` (DINOv3: ``gamma_1``/``gamma_2``, RoPE passed to the attention).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from aggzoo.models.backbones.timm_backbone import TimmBackbone
from aggzoo.models.features import Features

__all__ = ["AdaptedViT", "attention_output", "layer_scale"]


def attention_output(block: nn.Module, x: Tensor, rope: Tensor | None) -> Tensor:
    """``attn(norm1(x))`` of a timm block, before its layer scale: ``[B, N, C]``."""
    normed = block.norm1(x)
    return block.attn(normed) if rope is None else block.attn(normed, rope=rope)


def layer_scale(block: nn.Module, branch: int, y: Tensor) -> Tensor:
    """The block's layer scale of residual ``branch`` (1 attention, 2 MLP) applied to ``y``: timm's
    ``VisionTransformer`` names it ``ls1``/``ls2`` (an identity when off), ``Eva`` ``gamma_1``/``gamma_2``."""
    module = getattr(block, f"ls{branch}", None)
    if module is not None:
        return module(y)
    gamma = getattr(block, f"gamma_{branch}", None)
    return y if gamma is None else gamma * y


class AdaptedViT(TimmBackbone):
    """A timm ViT, frozen (final norm included), whose blocks :meth:`forward` runs one by one.

    Subclasses add their adapters (the only trainable parameters, as upstream) and override
    :meth:`adapted_block`. ``x: [B, 3, H, W] -> Features(maps=([B, C, H/p, W/p],), cls=[B, C])``,
    after the final norm.

    Args:
        model_name: a timm ViT (DINOv2 ``vit_base_patch14_dinov2``, DINOv3 ``vit_*_patch16_dinov3``...).
        pretrained: load the ViT's pretrained weights.
        frozen_stages: ``None`` (upstream) freezes the whole ViT, final norm included, so that only the
            adapters train; an integer freezes that many leading levels as :class:`TimmBackbone` does.
        **model_kwargs: passed to ``timm.create_model`` (``img_size``, ``dynamic_img_size``, ``depth``...).
    """

    def __init__(self, model_name: str, *, pretrained: bool = False, frozen_stages: int | None = None,
                 **model_kwargs: Any) -> None:
        super().__init__(model_name, pretrained=pretrained, out_indices=(-1,), final_norm=True,
                         frozen_stages=frozen_stages or 0, **model_kwargs)
        if not self.is_vit:
            raise ValueError(f"{type(self).__name__} needs a timm ViT, got {model_name!r}")
        if frozen_stages is None:
            self.model.requires_grad_(False)
            self._frozen_modules = [m for m in self.model.modules() if not list(m.children())]

    def adapted_block(self, index: int, block: nn.Module, x: Tensor, rope: Tensor | None,
                      grid: tuple[int, int]) -> Tensor:
        """Block ``index`` on tokens ``x: [B, prefix + n, C]`` (``grid = (H/p, W/p)``); by default the plain
        block, written out as timm runs it."""
        x = x + block.drop_path1(layer_scale(block, 1, attention_output(block, x, rope)))
        return x + block.drop_path2(layer_scale(block, 2, block.mlp(block.norm2(x))))

    def forward(self, x: Tensor) -> Features:
        image_size = (x.shape[-2], x.shape[-1])
        grid = tuple(self.model.patch_embed.dynamic_feat_size(image_size))
        tokens = self.embed_tokens(x)
        rope = self.rotary_embedding(image_size)
        for index, block in enumerate(self.model.blocks):
            tokens = self.adapted_block(index, block, tokens, rope, grid)
        out = self.model.norm(tokens)
        return Features(maps=(self.patch_map(out, image_size),), cls=out[:, 0])
