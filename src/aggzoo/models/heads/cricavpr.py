"""CricaVPR: regional GeM features of the patch map and a cross-image encoder over the batch.

F. Lu, X. Lan, L. Zhang, D. Jiang, Y. Wang, C. Yuan, "CricaVPR: Cross-image Correlation-aware
Representation Learning for Visual Place Recognition", CVPR 2024, arXiv:2402.19231. Original code:
Lu-Feng/CricaVPR ``network.py`` (MIT); read for the computation, defaults and state-dict names only.

On the final-norm patch map ``x: [B, C, H, W]`` and CLS token ``t: [B, C]`` (the backbone is DINOv2
with the multi-scale convolution adapters, :mod:`aggzoo.models.backbones.multiconv_adapter`):

- ``x_i <- x_i / ||x_i||`` over channels; one GeM (learnable ``p``, init 3, shared) per cell of a
  2 x 2 and of a 3 x 3 grid, cells row-major;
- tokens ``[t, 4 cells, 9 cells]: [B, 14, C]`` (the CLS token as it is, neither normalised nor pooled);
- the cross-image encoder (:class:`~aggzoo.layers.cross_image.CrossImageEncoder`: each of the 14
  positions attends over the same position of every image in the batch), flatten, L2:
  ``D = 14 C`` = 10752 on ViT-B. The descriptor depends on the batch (:attr:`Head.batch_dependent`).

Grid cells: upstream hard-codes the slices of its 16 x 16 map (224 x 224 inputs): rows/cols
``0:8, 8:16`` and ``0:5, 5:11, 11:16``. Here the cut between cells ``i`` and ``i+1`` of a ``g``-cell
axis of length ``L`` is ``floor((i+1) L / g + 1/2)``, which gives exactly those slices at 16 and
proportional cells at other sizes (upstream's fixed slices would leave a 23 x 23 map's cells uneven).

Optional PCA to 4096 (the paper's compact descriptor): fit with ``evaluation.postprocess.whitening_fit`` and
``whitening_dim=4096``. Upstream's sklearn PCA centres and projects, without whitening or a final L2, and
searches by L2 distance: ``evaluation.postprocess.whitening_kind=project evaluation.search.metric=l2``, the defaults the
``cricavpr_dinov2_vitb14.official`` cfg states (:mod:`aggzoo.zoo.cricavpr`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from aggzoo.layers.cross_image import CrossImageEncoder
from aggzoo.layers.pooling import GeMPool
from aggzoo.models.features import Features
from aggzoo.models.heads.base import Head

__all__ = ["CricaVPR", "grid_cuts", "regional_gem"]


def grid_cuts(length: int, cells: int) -> list[int]:
    """``[0, c_1, ..., length]``: the boundaries of ``cells`` near-equal cells (16, 3 -> [0, 5, 11, 16])."""
    return [(2 * i * length + cells) // (2 * cells) for i in range(cells + 1)]


def regional_gem(x: Tensor, grids: Sequence[int], pool: GeMPool) -> Tensor:
    """``x: [B, C, H, W]`` -> ``[B, sum(g^2), C]``: ``pool`` of every cell of each ``g x g`` grid, row-major."""
    height, width = x.shape[-2:]
    regions = []
    for cells in grids:
        rows, cols = grid_cuts(height, cells), grid_cuts(width, cells)
        for r in range(cells):
            for c in range(cells):
                regions.append(pool(x[:, :, rows[r]:rows[r + 1], cols[c]:cols[c + 1]]))
    return torch.stack(regions, dim=1)


class CricaVPR(Head):
    """CricaVPR head.

    Args:
        in_channels: ``C`` of the patch map and the CLS token (768 for DINOv2 ViT-B/14).
        grids: the regional grids (paper: 2 x 2 and 3 x 3).
        p: initial GeM exponent (learned; paper 3).
        cross_image: apply the cross-image encoder (the method; ``False`` gives the batch-independent
            regional descriptor, an ablation).
        encoder_heads: attention heads of the encoder (paper 16; must divide ``C``).
        encoder_ffn_dim: its feed-forward width (paper 2048).

    Shapes: ``Features(maps=(..., [B, C, H, W]), cls=[B, C]) -> [B, (1 + sum(g^2)) C]``,
    ``H, W >= max(grids)``. State-dict names: ``gem.p`` (upstream ``aggregation.1.p``),
    ``encoder.layers.{0,1}.*`` (upstream's).
    """

    needs_cls = True

    def __init__(
        self,
        in_channels: int,
        *,
        grids: Sequence[int] = (2, 3),
        p: float = 3.0,
        cross_image: bool = True,
        encoder_heads: int = 16,
        encoder_ffn_dim: int = 2048,
    ) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.grids = tuple(int(g) for g in grids)
        self.num_tokens = 1 + sum(g * g for g in self.grids)
        self.out_dim = self.num_tokens * in_channels
        self.gem = GeMPool(p=p)
        self.encoder = (CrossImageEncoder(in_channels, num_heads=encoder_heads, ffn_dim=encoder_ffn_dim)
                        if cross_image else None)

    @property
    def batch_dependent(self) -> bool:
        return self.encoder is not None

    @property
    def min_positions(self) -> int:
        """Every grid cell needs a position: ``H, W >= max(grids)``."""
        return max(self.grids) ** 2

    def no_weight_decay(self) -> set[str]:
        return {"gem.p"}

    def region_tokens(self, features: Features) -> Tensor:
        """``[B, 1 + sum(g^2), C]``: the CLS token and the regional GeM features, before the encoder."""
        if features.cls is None:
            raise ValueError("CricaVPR needs a ViT backbone with a CLS token (features.cls is None): use "
                             "backbone=cricavpr_dinov2_vitb14 (or any ViT) rather than a CNN")
        x = features.last
        if min(x.shape[-2:]) < max(self.grids):
            raise ValueError(f"CricaVPR's {max(self.grids)}x{max(self.grids)} grid needs a map of at least that "
                             f"size, got {tuple(x.shape[-2:])}: use larger images")
        regions = regional_gem(F.normalize(x, dim=1), self.grids, self.gem)
        return torch.cat([features.cls.unsqueeze(1).to(regions.dtype), regions], dim=1)

    def forward(self, features: Features) -> Tensor:
        tokens = self.region_tokens(features)
        if self.encoder is not None:
            tokens = self.encoder(tokens)
        return F.normalize(tokens.flatten(1), dim=1)
