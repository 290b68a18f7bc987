"""One facet of one ViT block as the local features: the attention's query, key or value, or the block's output.

N. Keetha, A. Mishra, J. Karhade, K. M. Jatavallabhula, S. Scherer, M. Krishna, S. Garg, "AnyLoc: Towards
Universal Visual Place Recognition", RA-L 2023, arXiv:2308.00688. Followed for what a facet is: AnyLoc/DINO
``dinov2_extractor.py`` (``DinoV2ExtractFeatures``, BSD-3-Clause) hooks ``blocks[layer].attn.qkv`` (the fused
query/key/value projection of that block's pre-normed input, before it is split into heads) and keeps the
first, second or third ``C`` channels of its output for ``"query"``, ``"key"`` and ``"value"``, or hooks
``blocks[layer]`` itself for ``"token"``; the class token is dropped. No code taken from it.

Block ``b`` counts from 0 as DINOv2's ``blocks`` list does (AnyLoc's layer 31 of ViT-G/14 is ``block=31``).
The blocks after ``b`` are removed (timm's ``prune_intermediate_layers``), so a ViT-G cut at block 31 holds
32 of its 40 blocks. The features are returned raw: the L2 normalisation AnyLoc applies to them is the
head's first step (:class:`~aggzoo.models.heads.anyloc.AnyLocVLAD`).
"""

from __future__ import annotations

from typing import Any, Literal, get_args

import torch
from torch import Tensor

from aggzoo.models.backbones.timm_backbone import TimmBackbone
from aggzoo.models.features import Features

__all__ = ["FACETS", "Facet", "ViTFacet"]

Facet = Literal["query", "key", "value", "token"]
#: the facets a :class:`ViTFacet` returns, in the order of the fused ``qkv`` projection's outputs (then the block's)
FACETS: tuple[str, ...] = get_args(Facet)


class ViTFacet(TimmBackbone):
    """A timm ViT whose local features are one facet of block ``block``.

    Args:
        model_name: a timm ViT with fused ``attn.qkv`` projections (``vit_giant_patch14_dinov2``,
            ``vit_base_patch14_dinov2``, ``test_vit``, ...).
        block: the block, counted from 0 (negative: from the end).
        facet: ``"query"``, ``"key"`` or ``"value"`` (the thirds of ``attn.qkv(norm1(x))``, all heads,
            head-major, before any q/k normalisation), or ``"token"`` (the block's output, no final norm).
        pretrained: load the ViT's pretrained weights.
        frozen_stages: as :class:`TimmBackbone` (AnyLoc is training-free: its zoo entries freeze every block).
        **model_kwargs: passed to ``timm.create_model`` (``img_size``, ``dynamic_img_size``, ...).

    Shapes: ``x: [B, 3, H, W] -> Features(maps=([B, C, H/p, W/p],), cls=[B, C])``: the facet of the patch
    tokens as a map (row-major positions) and that of the class token; register tokens are dropped too.
    """

    def __init__(
        self,
        model_name: str,
        *,
        block: int = -1,
        facet: Facet = "value",
        pretrained: bool = False,
        frozen_stages: int = 0,
        **model_kwargs: Any,
    ) -> None:
        if facet not in FACETS:
            raise ValueError(f"facet must be one of {FACETS}, got {facet!r}")
        super().__init__(model_name, pretrained=pretrained, out_indices=(block,), frozen_stages=frozen_stages,
                         final_norm=False, **model_kwargs)
        if not self.is_vit:
            raise ValueError(f"ViTFacet needs a ViT (timm VisionTransformer), got {model_name!r}")
        self.block = self.out_indices[-1]
        self.facet = facet
        attention = self.model.blocks[self.block].attn
        if facet != "token" and not isinstance(getattr(attention, "qkv", None), torch.nn.Linear):
            raise ValueError(f"{model_name}: block {self.block}'s attention has no fused qkv projection, so its "
                             f"{facet!r} facet cannot be read; use facet='token' or a ViT with attn.qkv")

    def forward(self, x: Tensor) -> Features:
        height, width = x.shape[-2:]
        rope = self.rotary_embedding((height, width))  # None unless a RoPE ViT (DINOv3)
        tokens = self.embed_tokens(x)
        for block in self.model.blocks[: self.block]:
            tokens = self.run_block(block, tokens, rope)
        last = self.model.blocks[self.block]
        if self.facet == "token":
            out = self.run_block(last, tokens, rope)
        else:
            qkv = last.attn.qkv(last.norm1(tokens))  # [B, T, 3C]: query | key | value, each head-major
            out = qkv.chunk(3, dim=-1)[FACETS.index(self.facet)]
        cls = out[:, 0] if getattr(self.model, "cls_token", None) is not None else None
        return Features(maps=(self.patch_map(out, (height, width)),), cls=cls)
