"""ImAge head: the aggregation tokens themselves are the descriptor.

F. Lu, T. Jin, C. Ye, X. Lan, Y. Liu, C. Yuan, "Towards Implicit Aggregation: Robust Image
Representation for Place Recognition in the Transformer Era" (ImAge), NeurIPS 2025, arXiv:2511.06024.
Original code: Lu-Feng/ImAge ``network.py`` (MIT); no code taken from it.

The aggregation happens inside the backbone
(:class:`~aggzoo.models.backbones.aggregation_tokens.AggregationTokenViT`: T learnable tokens that
attend to the patches in the last blocks). This head only reads them:
``tokens: [B, T, C]`` (after the final LayerNorm) -> flatten token-major -> L2 -> ``[B, T*C]``
(6144 at T=8, C=768). It has no parameters.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from aggzoo.models.features import Features
from aggzoo.models.heads.base import Head

__all__ = ["ImAgeTokens"]


class ImAgeTokens(Head):
    """Flattened, L2-normalised aggregation tokens.

    Args:
        in_channels: ``C`` of the tokens (the ViT width).
        num_tokens: ``T``; must equal the backbone's ``num_tokens`` (paper 8).

    Shapes: ``Features(tokens=[B, T, C]) -> [B, T*C]``, token-major (``[t0 c0..cC, t1 c0..cC, ...]``).
    """

    needs_tokens = True

    def __init__(self, in_channels: int, *, num_tokens: int = 8) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.num_tokens = num_tokens
        self.out_dim = num_tokens * in_channels

    @property
    def required_tokens(self) -> int:
        return self.num_tokens

    def forward(self, features: Features) -> Tensor:
        tokens = features.tokens
        if tokens is None:
            raise ValueError(
                "ImAgeTokens needs a backbone that inserts aggregation tokens (features.tokens is None): "
                "use aggzoo.models.backbones.aggregation_tokens.AggregationTokenViT "
                "(backbone=image_dinov2_vitb14_reg4)."
            )
        if tuple(tokens.shape[1:]) != (self.num_tokens, self.in_channels):
            raise ValueError(
                f"ImAgeTokens expects tokens [B, {self.num_tokens}, {self.in_channels}], got "
                f"{list(tokens.shape)}: set the head's num_tokens to the backbone's num_tokens."
            )
        return F.normalize(tokens.flatten(1), dim=-1)
