"""A ViT that also reports how much its class token attends to each patch in the last block (FoL).

FoL (Wang et al., AAAI 2025, arXiv:2504.09881; chenshunpeng/FoL ``backbone/dinov2_FoL.py``, Apache-2.0,
read for the computation only) guides its aggregation by the last block's attention of the class token
to the patches: ``softmax(q k^T * scale)`` of that block's own ``norm1`` + ``qkv``, the class row, the patch
columns, summed over the heads. The block itself runs unchanged; this backbone recomputes the class row of
its attention beside it (one ``[B, heads, 1, N]`` product, not the ``N x N`` matrix: each softmax row is
independent) and returns it as :attr:`Features.cls_attention`.
"""

from __future__ import annotations

from torch import Tensor, nn

from aggzoo.models.backbones.timm_backbone import TimmBackbone
from aggzoo.models.features import Features

__all__ = ["ClassAttentionViT", "class_token_attention"]


def class_token_attention(block: nn.Module, tokens: Tensor, num_prefix: int) -> Tensor:
    """The class token's attention to the patches in ``block`` (a timm ViT block), summed over heads.

    Args:
        block: a timm ``Block`` (``norm1``, ``attn.qkv``, ``attn.num_heads``, ``attn.scale``).
        tokens: ``[B, N, C]``, the block's input (class token first, then ``num_prefix - 1`` registers).
        num_prefix: leading non-patch tokens.

    Returns ``[B, N - num_prefix]``: for each patch, ``sum_h softmax_j(q_h,cls . k_h,j * scale)`` over all
    ``N`` keys (class and registers included in the softmax, as the attention itself), patch columns kept.
    """
    attn = block.attn
    normed = block.norm1(tokens)
    batch, num_tokens, channels = normed.shape
    heads = attn.num_heads
    qkv = attn.qkv(normed).reshape(batch, num_tokens, 3, heads, channels // heads).permute(2, 0, 3, 1, 4)
    q = attn.q_norm(qkv[0][:, :, :1])                                    # [B, h, 1, d]: the class query
    k = attn.k_norm(qkv[1])                                              # [B, h, N, d]
    weights = ((q @ k.transpose(-2, -1)) * attn.scale).softmax(dim=-1)   # [B, h, 1, N]
    return weights[:, :, 0, num_prefix:].sum(dim=1)


class ClassAttentionViT(TimmBackbone):
    """A timm ViT whose blocks run here, returning the final-norm patch map, the class token and the last
    block's class-to-patch attention (:func:`class_token_attention`).

    ``x: [B, 3, H, W] -> Features(maps=([B, C, H/p, W/p],), cls=[B, C], cls_attention=[B, H/p * W/p])``.
    Arguments as :class:`TimmBackbone` (``final_norm`` is always on: FoL reads the normed tokens).
    """

    def __init__(self, model_name: str, **kwargs: object) -> None:
        kwargs.pop("final_norm", None)
        super().__init__(model_name, final_norm=True, out_indices=(-1,), **kwargs)  # type: ignore[arg-type]
        if not self.is_vit:
            raise ValueError(f"{type(self).__name__} needs a timm ViT with a class token, got {model_name!r}")
        if getattr(self.model, "rope", None) is not None:
            raise ValueError(f"{type(self).__name__} reads an additive-position ViT's attention (DINOv2), "
                             f"not a RoPE one: {model_name!r}")

    def forward(self, x: Tensor) -> Features:
        image_size = (x.shape[-2], x.shape[-1])
        tokens = self.embed_tokens(x)
        rope = self.rotary_embedding(image_size)
        blocks = list(self.model.blocks)
        for block in blocks[:-1]:
            tokens = self.run_block(block, tokens, rope)
        attention = class_token_attention(blocks[-1], tokens, self.model.num_prefix_tokens)
        tokens = self.model.norm(self.run_block(blocks[-1], tokens, rope))
        return Features(maps=(self.patch_map(tokens, image_size),), cls=tokens[:, 0], cls_attention=attention)
