"""EDTformer: an efficient decoder transformer over the ViT tokens.

T. Jin, F. Lu, S. Hu, C. Yuan, Y. Liu, "EDTformer: An Efficient Decoder Transformer for Visual
Place Recognition", IEEE TCSVT 2025, arXiv:2412.00784. Original code: Tong-Jin01/EDTformer
``network.py`` and ``SACA.py`` (MIT); re-implemented from the paper, with defaults and
state-dict names checked against that code. The paper's LoPA adapters belong to the backbone, not
to this head: :class:`aggzoo.models.backbones.lopa.LoPAViT` (``backbone=dinov2_vitb14_lopa``).

With ``C`` token channels, ``Q`` queries, ``L`` decoder blocks, ``d`` output channels and ``R``
output rows:

``tokens T = [cls; patches] [B, 1+n, C] -> M = Linear(C -> C)(T)``; learned queries
``q [1, Q, C]`` (init N(0, 1e-6^2)); each simplified decoder block (no feed-forward network,
post-norm, dropout 0.1 in training):
``q <- LN(q + SelfAttn(q))``, ``q <- LN(q + CrossAttn(q, M, M))``; then ``Linear(C -> d)`` over
channels -> ``[B, Q, d]``, ``Linear(Q -> R)`` over queries -> ``[B, d, R]`` -> flatten
channel-major -> L2 -> ``[B, d*R]``. Paper: DINOv2 ViT-B/14 final-normed tokens (``C = 768``),
``Q = 64, L = 2``, 16 heads, ``d = 256, R = 16`` -> 4096-D.

State-dict names mirror the original (``fc``, ``decoder.layers.{i}.{self_attn, multihead_attn,
norm1, norm2}``, ``queries``, ``channel_proj``, ``row_proj``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aggzoo.models.features import Features
from aggzoo.models.heads.base import Head

__all__ = ["EDTformer", "SimplifiedDecoderLayer"]


class SimplifiedDecoderLayer(nn.Module):
    """Post-norm transformer decoder block without the feed-forward network.

    ``q: [B, Q, C], memory: [B, m, C] -> [B, Q, C]``:
    ``q <- LN_1(q + Drop(SelfAttn(q)))``, ``q <- LN_2(q + Drop(CrossAttn(q, memory)))``.
    """

    def __init__(self, dim: int, num_heads: int, dropout: float) -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(dim, num_heads, dropout=dropout, batch_first=True)
        self.multihead_attn = nn.MultiheadAttention(dim, num_heads, dropout=dropout, batch_first=True)
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)

    def query_block(self, q: Tensor) -> Tensor:
        """``LN_1(q + Drop(SelfAttn(q)))``: ``[B, Q, C] -> [B, Q, C]``."""
        return self.norm1(q + self.dropout1(self.self_attn(q, q, q, need_weights=False)[0]))

    def memory_block(self, q: Tensor, memory: Tensor) -> Tensor:
        """``LN_2(q + Drop(CrossAttn(q, memory)))``: ``[B, Q, C], [B, m, C] -> [B, Q, C]``."""
        return self.norm2(q + self.dropout2(self.multihead_attn(q, memory, memory, need_weights=False)[0]))

    def forward(self, q: Tensor, memory: Tensor) -> Tensor:
        return self.memory_block(self.query_block(q), memory)


class _DecoderStack(nn.Module):
    """``L`` decoder blocks under ``layers`` (the original's ``nn.TransformerDecoder`` key layout)."""

    def __init__(self, dim: int, num_heads: int, num_layers: int, dropout: float) -> None:
        super().__init__()
        self.layers = nn.ModuleList(SimplifiedDecoderLayer(dim, num_heads, dropout) for _ in range(num_layers))

    def forward(self, queries: Tensor, memory: Tensor) -> Tensor:
        """``queries [1, Q, C]`` (shared by every image), ``memory [B, m, C]`` -> ``[B, Q, C]``."""
        batch = memory.shape[0]
        first = self.layers[0]
        if self.training and first.dropout1.p > 0:  # a dropout mask per image, as upstream
            q = first.query_block(queries.expand(batch, -1, -1))
        else:
            # Deterministic, and nothing before the first cross-attention depends on the image:
            # the first self-attention runs once per batch instead of once per image.
            q = first.query_block(queries).expand(batch, -1, -1)
        q = first.memory_block(q, memory)
        for layer in self.layers[1:]:
            q = layer(q, memory)
        return q


class EDTformer(Head):
    """EDTformer head. Needs a ViT backbone: it reads the class token (``features.cls``) and the
    patch tokens (``features.last``, row-major positions).

    Args:
        in_channels: ``C``, the token width (768 for ViT-B).
        num_queries: ``Q`` (paper: 64).
        num_layers: ``L``, simplified decoder blocks (paper: 2).
        num_heads: attention heads; must divide ``C`` (paper: 16).
        out_channels: ``d``, channel projection size (paper: 256).
        out_rows: ``R``, query projection size (paper: 16).
        dropout: dropout in the attention and residual branches during training (paper code: 0.1).

    Shapes: ``Features(maps=(..., [B, C, H, W]), cls=[B, C]) -> [B, d * R]``, laid out ``[d, R]`` (channel-major).
    """

    needs_cls = True

    def __init__(
        self,
        in_channels: int,
        *,
        num_queries: int = 64,
        num_layers: int = 2,
        num_heads: int = 16,
        out_channels: int = 256,
        out_rows: int = 16,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        if in_channels % num_heads:
            raise ValueError(f"EDTformer: num_heads={num_heads} must divide the token width in_channels={in_channels}")
        self.in_channels = in_channels
        self.num_queries = num_queries
        self.out_channels = out_channels
        self.out_rows = out_rows
        self.out_dim = out_channels * out_rows
        self.fc = nn.Linear(in_channels, in_channels)
        self.decoder = _DecoderStack(in_channels, num_heads, num_layers, dropout)
        # Near-zero queries: at init every query starts as the same (almost null) vector and the
        # first self-attention + LayerNorm decides how they differ.
        self.queries = nn.Parameter(torch.empty(1, num_queries, in_channels))
        nn.init.normal_(self.queries, std=1e-6)
        self.channel_proj = nn.Linear(in_channels, out_channels)
        self.row_proj = nn.Linear(num_queries, out_rows)

    def forward(self, features: Features) -> Tensor:
        if features.cls is None:
            raise ValueError(
                "EDTformer attends over the class token and the patch tokens, but these features have no "
                "class token (features.cls is None). Use a ViT backbone that returns it, e.g. "
                "TimmBackbone('vit_base_patch14_dinov2', dynamic_img_size=True)."
            )
        patches = features.last.flatten(2).transpose(1, 2)  # [B, n, C]
        memory = self.fc(torch.cat([features.cls.unsqueeze(1), patches], dim=1))  # [B, 1+n, C]
        q = self.decoder(self.queries, memory)  # [B, Q, C]
        x = self.channel_proj(q)  # [B, Q, d]
        x = self.row_proj(x.transpose(1, 2))  # [B, d, R]
        return F.normalize(x.flatten(1), dim=1)
