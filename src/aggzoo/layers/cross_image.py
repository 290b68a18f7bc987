"""The cross-image encoder of CricaVPR and SuperVLAD: a transformer whose sequence is the batch.

F. Lu, X. Lan, L. Zhang, D. Jiang, Y. Wang, C. Yuan, "CricaVPR: Cross-image Correlation-aware
Representation Learning for Visual Place Recognition", CVPR 2024, arXiv:2402.19231; reused by
SuperVLAD (NeurIPS 2024). Original code: Lu-Feng/CricaVPR ``network.py`` and Lu-Feng/SuperVLAD
``model/network.py`` (MIT); read for the configuration only, the module is torch's own.

Upstream hands ``[B, T, C]`` (one row of ``T`` tokens per image) to an ``nn.TransformerEncoder``
built with ``batch_first=False``, so torch reads the axes as (sequence ``B``, batch ``T``, ``C``):
token ``t`` of each image attends over token ``t`` of every image in the batch. The descriptors
therefore depend on which images share a batch (``Head.batch_dependent``); that is the method, kept
as is. Built with torch's ``nn.TransformerEncoder`` (post-norm layers, GELU), so the state-dict
names are upstream's (``layers.{i}.self_attn.in_proj_weight``, ``linear1``, ``norm1``...).
"""

from __future__ import annotations

from torch import Tensor, nn

__all__ = ["CrossImageEncoder"]


class CrossImageEncoder(nn.TransformerEncoder):
    """``x: [B, T, C] -> [B, T, C]``, each of the ``T`` positions attending across the ``B`` images.

    Args:
        dim: ``C`` (768 for DINOv2 ViT-B/14 in both papers).
        num_layers: encoder layers (2 in both papers).
        num_heads: attention heads (16).
        ffn_dim: hidden width of each layer's feed-forward block (2048, torch's default).
        dropout: dropout of attention and feed-forward (0.1, torch's default; off in eval mode).
    """

    def __init__(self, dim: int, *, num_layers: int = 2, num_heads: int = 16, ffn_dim: int = 2048,
                 dropout: float = 0.1) -> None:
        layer = nn.TransformerEncoderLayer(
            d_model=dim, nhead=num_heads, dim_feedforward=ffn_dim, dropout=dropout, activation="gelu",
            batch_first=False,
        )
        # No padding masks are ever passed, so torch's nested-tensor path would never apply.
        super().__init__(layer, num_layers=num_layers, enable_nested_tensor=False)

    def forward(self, x: Tensor) -> Tensor:  # type: ignore[override]
        # batch_first=False on purpose: the image axis B is the attention's sequence axis.
        return super().forward(x)
