"""ViT backbone with learnable aggregation tokens inserted before a chosen block (ImAge).

F. Lu, T. Jin, C. Ye, X. Lan, Y. Liu, C. Yuan, "Towards Implicit Aggregation: Robust Image
Representation for Place Recognition in the Transformer Era" (ImAge), NeurIPS 2025, arXiv:2511.06024.
Original code: Lu-Feng/ImAge ``network.py`` and ``initialize_agg_tokens.py`` (MIT); followed for the
insertion point, freezing, initialisation and descriptor, no code taken from it.

The patch embedding, positional embedding (+ CLS and register tokens) and blocks ``0 .. b-1`` run
frozen, as in the pretrained model. Before block ``b``, ``T`` learnable tokens ``[1, T, C]`` are
prepended to the sequence, without positional embedding; blocks ``b .. L-1`` (trainable) let them
attend to, and gather from, every patch. After the final LayerNorm the sequence is split back into
``tokens: [B, T, C]``, ``cls: [B, C]`` and the patch map ``[B, C, H/p, W/p]``.

Paper configuration: DINOv2 ViT-B/14 with 4 registers (``vit_base_patch14_reg4_dinov2``), T = 8,
b = 8 of 12 blocks; the ImAge head flattens the tokens into a 6144-D descriptor.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aggzoo.layers.rope import unrotated_prefix
from aggzoo.models.backbones.timm_backbone import TimmBackbone
from aggzoo.models.data_init import DataInit
from aggzoo.models.features import Features

__all__ = ["AggregationTokenViT", "token_scale"]


def token_scale(descriptors: Tensor, centroids: Tensor) -> float:
    """NetVLAD-style sharpness ``alpha = -ln(0.01) / mean(top1 - top2)`` of the cosine similarities
    between L2-normalised ``descriptors: [N, C]`` and ``centroids: [T, C]``; with a single centroid,
    ``-ln(0.01) / mean(top1)`` (as ImAge does)."""
    sims = F.normalize(descriptors.float(), dim=1) @ F.normalize(centroids.float(), dim=1).T
    top = sims.topk(min(2, sims.shape[1]), dim=1).values
    gap = (top[:, 0] - top[:, 1]).mean().item() if top.shape[1] > 1 else top[:, 0].mean().item()
    if gap <= 0:
        raise ValueError("aggregation-token init: the descriptors do not separate the k-means centroids "
                         "(mean similarity gap <= 0); sample more, or more varied, images")
    return -math.log(0.01) / gap


class AggregationTokenViT(TimmBackbone):
    """A timm ViT with ``T`` aggregation tokens inserted before block ``b``.

    Args:
        model_name: a timm ViT (``vit_base_patch14_reg4_dinov2``, ``vit_base_patch14_dinov2``,
            ``test_vit``, ...); register tokens are supported.
        num_tokens: ``T`` (paper 8).
        insert_before_block: ``b`` (paper 8 of 12). Patch/positional embedding and blocks
            ``0..b-1`` are frozen and run without autograd; blocks ``b..`` and the final norm train.
        pretrained: load the ViT's pretrained weights (timm hub).
        **model_kwargs: passed to ``timm.create_model`` (``dynamic_img_size=True`` for inputs other
            than the model's default size).

    ``x: [B, 3, H, W] -> Features(maps=([B, C, H/p, W/p],), cls=[B, C], tokens=[B, T, C])``, all after
    the final LayerNorm. The tokens are ``self.aggregation_tokens: [1, T, C]`` (init normal, std 1e-6).

    Data-dependent initialisation (``data_init = "kmeans"``): k-means on L2-normalised final patch
    features of the backbone *without* tokens (:meth:`data_init_features`), then
    :meth:`init_from_clusters` sets the tokens to ``alpha * c_hat``.
    """

    #: The tokens are initialised from k-means centroids by the data-init callback.
    data_init: ClassVar[DataInit] = "kmeans"

    def __init__(
        self,
        model_name: str,
        *,
        num_tokens: int = 8,
        insert_before_block: int = 8,
        pretrained: bool = False,
        **model_kwargs: Any,
    ) -> None:
        super().__init__(model_name, pretrained=pretrained, out_indices=(-1,), frozen_stages=insert_before_block,
                         final_norm=True, **model_kwargs)
        if not self.is_vit:
            raise ValueError(f"AggregationTokenViT needs a ViT (timm VisionTransformer), got {model_name!r}")
        num_blocks = len(self.model.blocks)
        if not 0 <= insert_before_block < num_blocks:
            raise ValueError(f"insert_before_block must be in [0, {num_blocks - 1}] for {model_name} "
                             f"({num_blocks} blocks), got {insert_before_block}")
        if num_tokens < 1:
            raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
        self.num_tokens = num_tokens
        self.insert_before_block = insert_before_block
        self.aggregation_tokens = nn.Parameter(torch.empty(1, num_tokens, self.out_channels))
        nn.init.normal_(self.aggregation_tokens, std=1e-6)

    @property
    def kmeans_clusters(self) -> int:
        """k-means clusters the data-init callback computes: one per token."""
        return self.num_tokens

    @torch.no_grad()
    def init_from_clusters(self, centroids: Tensor, descriptors: Tensor) -> None:
        """Set the tokens to ``alpha * c_hat`` (ImAge's init).

        Args:
            centroids: k-means centres ``[T, C]`` of L2-normalised local features (see
                :meth:`data_init_features`).
            descriptors: the features ``[N, C]`` they were computed from (for ``alpha``).
        """
        expected = (self.num_tokens, self.out_channels)
        if tuple(centroids.shape) != expected:
            raise ValueError(f"expected centroids of shape {expected} (num_tokens, channels), "
                             f"got {tuple(centroids.shape)}")
        alpha = token_scale(descriptors, centroids)
        tokens = alpha * F.normalize(centroids.float(), dim=1)
        self.aggregation_tokens.copy_(tokens.unsqueeze(0).to(self.aggregation_tokens))

    def _run(self, images: Tensor, insert_tokens: bool) -> Features:
        model = self.model
        batch, _, height, width = images.shape
        frozen = list(model.blocks[: self.insert_before_block])
        # Run the frozen prefix without autograd unless someone unfroze part of it.
        frozen_params = [getattr(model, name, None) for name in ("cls_token", "reg_token", "pos_embed")]
        frozen_params = [p for p in frozen_params if p is not None]
        frozen_params += [p for m in (model.patch_embed, *frozen) for p in m.parameters()]
        rope = self.rotary_embedding((height, width))  # None unless a RoPE ViT (DINOv3)
        with torch.set_grad_enabled(torch.is_grad_enabled() and any(p.requires_grad for p in frozen_params)):
            x = self.embed_tokens(images)
            for block in frozen:
                x = self.run_block(block, x, rope)
        num_tokens = 0
        if insert_tokens:
            num_tokens = self.num_tokens
            x = torch.cat([self.aggregation_tokens.expand(batch, -1, -1).to(x.dtype), x], dim=1)
            if rope is not None:
                # The tokens carry no position (as with DINOv2's additive embedding): unrotated, like
                # the class and storage tokens that Eva's attention leaves out of RoPE.
                rope = unrotated_prefix(rope, num_tokens)
        for block in model.blocks[self.insert_before_block:]:
            x = self.run_block(block, x, rope)
        x = model.norm(x)
        patch_map = self.patch_map(x, (height, width), start=num_tokens + model.num_prefix_tokens)
        cls = x[:, num_tokens] if getattr(model, "cls_token", None) is not None else None
        return Features(maps=(patch_map,), cls=cls, tokens=x[:, :num_tokens] if insert_tokens else None)

    def forward(self, x: Tensor) -> Features:
        return self._run(x, insert_tokens=True)

    @torch.no_grad()
    def data_init_features(self, images: Tensor) -> Tensor:
        """Final patch features ``[B, C, H/p, W/p]`` of the backbone *without* aggregation tokens: what
        ImAge clusters to initialise the tokens (its pretrained model has none)."""
        return self._run(images, insert_tokens=False).last
