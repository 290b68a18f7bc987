"""BoQ: a bag of learnable queries cross-attending to the local features.

A. Ali-bey, B. Chaib-draa, P. Giguere, "BoQ: A Place is Worth a Bag of Learnable Queries",
CVPR 2024, arXiv:2405.07364. Original code: amaralibey/Bag-of-Queries ``src/boq.py`` (MIT);
re-implemented from the paper, with defaults and state-dict names checked against that code.

With ``p`` projected channels, ``Q`` queries per block, ``L`` blocks and ``R`` output rows:

``x: [B, C, H, W] -> Conv3x3(C -> p) -> tokens X [B, n, p] -> LayerNorm``, then for each block
``l = 1..L``:

- ``X <- TransformerEncoderLayer(X)`` (post-norm, ``p/64`` heads, FFN ``4p``, no dropout);
- learned queries ``q_l [1, Q, p]`` (init N(0, 1)) become ``LN(q_l + SelfAttn(q_l))``;
- ``O_l = LN(CrossAttn(q_l, X, X)) [B, Q, p]``; the encoded ``X`` goes on to the next block.

``O = cat_l(O_l) [B, L*Q, p] -> Linear(L*Q -> R)`` over the query axis -> ``[B, p, R]`` ->
flatten channel-major -> L2 -> ``[B, p*R]``. Released: ResNet-50 layer3 (``C = 1024``, 20 x 20
maps at 320 x 320), ``p = 512, Q = 64, L = 2, R = 32`` -> 16384-D; DINOv2 ViT-B/14 (``C = 768``,
no final norm), ``p = 384`` -> 12288-D.

State-dict names mirror the original (``proj_c``, ``norm_input``, ``boqs.{i}.{encoder, queries,
self_attn, norm_q, cross_attn, norm_out}``, ``fc``), so official checkpoints map 1:1 after
stripping their ``aggregator.`` prefix.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aggzoo.models.features import Features
from aggzoo.models.heads.base import Head

__all__ = ["BoQ", "BoQBlock"]

#: BoQ gives every attention head 64 channels.
_HEAD_DIM = 64


class BoQBlock(nn.Module):
    """One BoQ block: encode the tokens, then let ``Q`` learned queries read them.

    ``x: [B, n, p] -> (encoded x [B, n, p], query outputs [B, Q, p], attention [B, Q, n] | None)``.
    """

    def __init__(self, dim: int, num_queries: int, num_heads: int) -> None:
        super().__init__()
        self.encoder = nn.TransformerEncoderLayer(
            d_model=dim, nhead=num_heads, dim_feedforward=4 * dim, dropout=0.0, batch_first=True
        )
        self.queries = nn.Parameter(torch.randn(1, num_queries, dim))
        self.self_attn = nn.MultiheadAttention(dim, num_heads, batch_first=True)
        self.norm_q = nn.LayerNorm(dim)
        self.cross_attn = nn.MultiheadAttention(dim, num_heads, batch_first=True)
        self.norm_out = nn.LayerNorm(dim)

    def query_set(self) -> Tensor:
        """``LN(q + SelfAttn(q)) [1, Q, p]``. It does not depend on the image, so it is computed
        once per forward and broadcast over the batch instead of once per image."""
        q = self.queries
        return self.norm_q(q + self.self_attn(q, q, q, need_weights=False)[0])

    def forward(self, x: Tensor, need_weights: bool = False) -> tuple[Tensor, Tensor, Tensor | None]:
        x = self.encoder(x)
        q = self.query_set().expand(x.shape[0], -1, -1)
        out, attn = self.cross_attn(q, x, x, need_weights=need_weights)
        return x, self.norm_out(out), attn


class BoQ(Head):
    """BoQ head.

    Args:
        in_channels: ``C`` of the last map.
        proj_channels: ``p``, channels after the 3x3 projection; must be a multiple of 64 (one
            attention head per 64 channels). Paper: 512 (ResNet-50), 384 (DINOv2).
        num_queries: ``Q``, learned queries per block (paper: 64).
        num_layers: ``L``, number of BoQ blocks (paper: 2).
        row_dim: ``R``, output rows of the final projection over the ``L*Q`` query outputs (paper: 32).

    Shapes: ``Features(maps=(..., [B, C, H, W])) -> [B, p * R]``, laid out ``[p, R]`` (channel-major).
    :meth:`attention_maps` returns the cross-attention of every block.
    """

    def __init__(
        self,
        in_channels: int,
        *,
        proj_channels: int = 512,
        num_queries: int = 64,
        num_layers: int = 2,
        row_dim: int = 32,
    ) -> None:
        super().__init__()
        if proj_channels < _HEAD_DIM or proj_channels % _HEAD_DIM:
            raise ValueError(
                f"BoQ uses one attention head per {_HEAD_DIM} channels, so proj_channels must be a positive "
                f"multiple of {_HEAD_DIM}; got {proj_channels}"
            )
        self.in_channels = in_channels
        self.proj_channels = proj_channels
        self.num_queries = num_queries
        self.row_dim = row_dim
        self.out_dim = proj_channels * row_dim
        self.proj_c = nn.Conv2d(in_channels, proj_channels, kernel_size=3, padding=1)
        self.norm_input = nn.LayerNorm(proj_channels)
        self.boqs = nn.ModuleList(
            BoQBlock(proj_channels, num_queries, proj_channels // _HEAD_DIM) for _ in range(num_layers)
        )
        self.fc = nn.Linear(num_layers * num_queries, row_dim)

    def _run(self, features: Features, need_weights: bool) -> tuple[Tensor, list[Tensor | None]]:
        x = self.proj_c(features.last).flatten(2).transpose(1, 2)  # [B, n, p], row-major positions
        x = self.norm_input(x)
        outs, attns = [], []
        for block in self.boqs:
            x, out, attn = block(x, need_weights=need_weights)
            outs.append(out)
            attns.append(attn)
        rows = self.fc(torch.cat(outs, dim=1).transpose(1, 2))  # [B, p, R]
        return F.normalize(rows.flatten(1), dim=1), attns

    def forward(self, features: Features) -> Tensor:
        return self._run(features, need_weights=False)[0]

    @torch.no_grad()
    def attention_maps(self, features: Features) -> list[Tensor]:
        """Cross-attention weights of each block, averaged over heads: ``L x [B, Q, H*W]``
        (reshape the last axis to ``[H, W]`` to display them)."""
        return self._run(features, need_weights=True)[1]
