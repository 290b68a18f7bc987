"""LoPA: EDTformer's parallel low-rank adapters beside a frozen ViT.

T. Jin, F. Lu, S. Hu, C. Yuan, Y. Liu, "EDTformer: An Efficient Decoder Transformer for Visual Place
Recognition", IEEE TCSVT 2025, arXiv:2412.00784. Original code: Tong-Jin01/EDTformer
``backbone/vision_transformer.py`` (``forward_features``) and ``backbone/LadderAdapter.py`` (MIT);
re-implemented from the paper, with the adapter layout and initialisation checked against that code.

A second token stream ``y`` runs beside the ViT's blocks and replaces their output:

``x_0 = y_0 = embed(image)``; for each block ``i = 1..L``: ``x_i = block_i(x_{i-1})``,
``y_i = A_i(y_{i-1} + x_i)`` with ``A(z) = z + s * fc2(GELU(fc1(z)))`` (``fc1: C -> r``, ``fc2: r -> C``,
upstream ``r = 4``, ``s = 0.5``); the output is ``norm(y_L)``. ``fc2`` starts at zero, so at
initialisation the output is the normalised sum of the embedding and every block's output. Upstream
trains the adapters only: the ViT, its final norm included, stays frozen (``frozen_stages=None``).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from aggzoo.models.backbones.timm_backbone import TimmBackbone
from aggzoo.models.features import Features

__all__ = ["LoPAAdapter", "LoPAViT"]


class LoPAAdapter(nn.Module):
    """``z -> z + scale * fc2(GELU(fc1(z)))`` on ``[B, N, C]`` tokens; ``fc2`` initialised to zero."""

    def __init__(self, dim: int, hidden_dim: int = 4, scale: float = 0.5) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.scale = scale
        nn.init.zeros_(self.fc2.weight)
        nn.init.zeros_(self.fc2.bias)

    def forward(self, z: Tensor) -> Tensor:
        return z + self.scale * self.fc2(self.act(self.fc1(z)))


class LoPAViT(TimmBackbone):
    """A timm ViT with one :class:`LoPAAdapter` per block in a parallel stream (see the module docstring).

    Args:
        model_name: a timm ViT (EDTformer: ``vit_base_patch14_dinov2``).
        adapter_dim: ``r``, the adapters' hidden width (upstream: 4).
        adapter_scale: ``s`` (upstream: 0.5).
        pretrained: load the ViT's pretrained weights (timm's hub).
        frozen_stages: ``None`` (upstream) freezes the whole ViT, final norm included, so that only the
            adapters train; an integer freezes that many leading levels as :class:`TimmBackbone` does.
        **model_kwargs: passed to ``timm.create_model`` (``img_size``, ``dynamic_img_size``, ``depth``...).

    Shapes: ``x: [B, 3, H, W] -> Features(maps=([B, C, H/p, W/p],), cls=[B, C])``.
    """

    def __init__(
        self,
        model_name: str,
        *,
        adapter_dim: int = 4,
        adapter_scale: float = 0.5,
        pretrained: bool = False,
        frozen_stages: int | None = None,
        **model_kwargs: Any,
    ) -> None:
        super().__init__(model_name, pretrained=pretrained, out_indices=(-1,), final_norm=True,
                         frozen_stages=frozen_stages or 0, **model_kwargs)
        if not self.is_vit:
            raise ValueError(f"LoPAViT needs a ViT (timm VisionTransformer), got {model_name!r}")
        if frozen_stages is None:
            self.model.requires_grad_(False)
            self._frozen_modules = [m for m in self.model.modules() if not list(m.children())]
        self.adapters = nn.ModuleList(
            LoPAAdapter(self.out_channels, adapter_dim, adapter_scale) for _ in range(len(self.model.blocks))
        )

    def forward(self, x: Tensor) -> Features:
        image_size = (x.shape[-2], x.shape[-1])
        tokens = self.embed_tokens(x)
        rope = self.rotary_embedding(image_size)  # None unless a RoPE ViT (DINOv3)
        stream = tokens
        for block, adapter in zip(self.model.blocks, self.adapters, strict=True):
            tokens = self.run_block(block, tokens, rope)
            stream = adapter(stream + tokens)
        out = self.model.norm(stream)
        return Features(maps=(self.patch_map(out, image_size),), cls=out[:, 0])
