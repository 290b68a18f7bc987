"""Dynamic power normalisation: a signed power whose exponent each sample predicts, plus the input.

SAGE (S. Chen et al., "SAGE: Spatial-visual Adaptive Graph Exploration for Efficient Visual Place
Recognition", ICLR 2026, arXiv:2509.25723) uses it twice (chenshunpeng/SAGE, MIT: ``DPN`` in
``backbone/dinov2_sage.py`` and in ``aggregators/SAGE.py``; read for the computation and the
state-dict names only): after each of the last DINOv2 blocks (on the tokens ``[B, N, C]``) and on the
aggregated cluster matrix ``[B, l, m]`` before its L2 normalisation.

For ``x: [B, L, D]``: ``p = sigmoid(MLP(mean_L x)) in (0, 1)`` per sample (``MLP: D -> h -> 1``,
dropout then ReLU after the first layer) and

``y = sign(x) (|x| + eps)^p + x``.

``p < 1`` compresses large magnitudes (a learned, per-sample square-root-like normalisation);
the ``+ x`` keeps a residual path. The module names are upstream's (``projection.{0,3}``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["DynamicPowerNorm"]


class DynamicPowerNorm(nn.Module):
    """``x: [B, L, D] -> [B, L, D]``, ``sign(x) (|x| + eps)^p + x`` with ``p: [B]`` predicted from ``mean_L x``.

    Args:
        dim: ``D``, the width the exponent predictor reads.
        hidden_dim: ``h``, its hidden width (SAGE: 16 in the backbone, ``D // 2`` in the aggregator).
        dropout: dropout after the predictor's first layer (upstream 0.1).
        eps: added to ``|x|`` so the power's gradient stays finite at 0 (upstream 1e-6).
    """

    def __init__(self, dim: int, hidden_dim: int, *, dropout: float = 0.1, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        # Index layout as upstream's keys: .0 linear, .1 dropout, .2 relu, .3 linear.
        self.projection = nn.Sequential(
            nn.Linear(dim, hidden_dim), nn.Dropout(dropout), nn.ReLU(), nn.Linear(hidden_dim, 1),
        )

    def exponent(self, x: Tensor) -> Tensor:
        """``p: [B, 1, 1]`` in ``(0, 1)``."""
        return torch.sigmoid(self.projection(x.mean(dim=1))).unsqueeze(-1)

    def forward(self, x: Tensor) -> Tensor:
        return torch.sign(x) * (x.abs() + self.eps).pow(self.exponent(x)) + x
