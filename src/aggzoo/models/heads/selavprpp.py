"""SelaVPR++: a projected GeM float descriptor and, optionally, a 512-bit hashing branch for a binary first stage.

F. Lu, T. Jin, X. Lan, L. Zhang, Y. Liu, Y. Wang, C. Yuan, "SelaVPR++: Towards Seamless Adaptation of
Foundation Models for Efficient Place Recognition", T-PAMI 2025, arXiv:2502.16601. Original code:
Lu-Feng/SelaVPRplusplus ``model/network.py`` (``GeoLocalizationNet``, ``STE_binary``) (MIT); read for the
computation, defaults and state-dict names only.

On a patch map ``x: [B, C, H, W]`` (the side-path features of
:class:`~aggzoo.models.backbones.side_adapter.SideAdapterViT`):

- float descriptor (``forward``): ``L2(W2 GeM(L2_c(W1 x)))``: ``W1: C -> C`` on every token, L2 over the
  channels, GeM (learnable ``p``, init 3), ``W2: C -> D`` (2048 on ViT-B, 4096 on ViT-L), L2.
- hashing branch (``hashing=True``; on the hashing side path's features): the same shape to ``bits`` = 512,
  ``z = L2(W4 GeM(L2_c(W3 x)))``, codes ``b = sign(z)`` (``+1`` at ``z >= 0``) with a straight-through
  gradient (:func:`aggzoo.layers.binarize.sign_ste`).

The two-branch evaluation (Hamming top 100 of the codes, re-ordered by the float descriptors) is the binary
first stage of :mod:`aggzoo.evaluation.index` (``evaluation.search.index=BFlat evaluation.search.refine=100``). The
hashing branch gets no gradient from ``forward``: it trains with its own loss on :meth:`SelaVPRpp.binary_codes`
(upstream ``train_rerank.py``), so a model built with ``hashing=True`` is meant to be trained that way or loaded.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from aggzoo.layers.binarize import sign_ste
from aggzoo.layers.pooling import GeMPool
from aggzoo.models.features import Features
from aggzoo.models.heads.base import Head

__all__ = ["ProjectedGeM", "SelaVPRpp"]


class ProjectedGeM(nn.Module):
    """``[B, C, H, W] -> [B, D]``: ``L2(out(GeM(L2_c(token(x)))))``, ``token: C -> C`` per position."""

    def __init__(self, in_channels: int, out_dim: int, *, p: float = 3.0) -> None:
        super().__init__()
        self.token = nn.Linear(in_channels, in_channels)
        self.gem = GeMPool(p=p)
        self.out = nn.Linear(in_channels, out_dim)

    def forward(self, x: Tensor) -> Tensor:
        tokens = self.token(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return F.normalize(self.out(self.gem(F.normalize(tokens, dim=1))), dim=-1)


class SelaVPRpp(Head):
    """SelaVPR++ head (see the module docstring).

    Args:
        in_channels: ``C`` of the patch map (768 ViT-B, 1024 ViT-L).
        out_dim: ``D`` of the float descriptor (paper: 2048 on ViT-B, 4096 on ViT-L).
        p: initial GeM exponents (learned; 3).
        hashing: add the hashing branch (the "rerank" checkpoints hold both).
        bits: code length of the hashing branch (paper 512).

    Shapes: ``Features(maps=(..., [B, C, H, W])) -> [B, D]``; :meth:`hash_embedding` ``-> z [B, bits]`` (unit
    norm), :meth:`binary_codes` ``-> b [B, bits]`` in ``{-1, +1}``. State-dict names: ``float_branch.{token,out}``,
    ``float_branch.gem.p`` (upstream ``linear1``, ``linear2``, ``aggregation.1.p``), ``hash_branch.{token,out}``,
    ``hash_branch.gem.p`` (upstream ``linear3``, ``linear4``, ``aggregation_hashing.1.p``).
    """

    def __init__(self, in_channels: int, *, out_dim: int = 2048, p: float = 3.0, hashing: bool = False,
                 bits: int = 512) -> None:
        super().__init__()
        if hashing and bits % 8:
            raise ValueError(f"bits must be a multiple of 8 (codes are packed into bytes), got {bits}")
        self.in_channels = in_channels
        self.out_dim = out_dim
        self.bits = bits if hashing else 0
        self.float_branch = ProjectedGeM(in_channels, out_dim, p=p)
        self.hash_branch = ProjectedGeM(in_channels, bits, p=p) if hashing else None

    def no_weight_decay(self) -> set[str]:
        return {"float_branch.gem.p", "hash_branch.gem.p"} if self.hash_branch is not None else {"float_branch.gem.p"}

    def forward(self, features: Features) -> Tensor:
        return self.float_branch(features.last)

    def hash_embedding(self, features: Features) -> Tensor:
        """``z [B, bits]``, unit norm, from the hashing branch's features."""
        if self.hash_branch is None:
            raise ValueError("this SelaVPR++ head has no hashing branch: build it with hashing=True")
        return self.hash_branch(features.last)

    def binary_codes(self, features: Features) -> Tensor:
        """``b = sign(z)`` in ``{-1, +1}`` (``+1`` at ``z >= 0``), straight-through gradient to ``z``."""
        return sign_ste(self.hash_embedding(features))
