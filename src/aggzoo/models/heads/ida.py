"""IDA multi-level head: DLA's iterative deep layer aggregation of 2-4 backbone levels, then GeM.

F. Yu, D. Wang, E. Shelhamer, T. Darrell, "Deep Layer Aggregation", CVPR 2018, arXiv:1707.06484.
Original code: ucbdrive/dla ``dla.py``, ``dla_up.py`` (BSD-3-Clause). Re-implemented from the paper.

The levels are aligned and merged shallow to deep as in :class:`~aggzoo.models.heads.afa.AFA`, but
each merge is a DLA root node ``x_{l+1} = ReLU(BN(Conv1x1([x_l; f_{l+1}])))`` and the descriptor
pools the last state ``x_L``: AFA without its attention, the ablation its paper compares against.
"""

from __future__ import annotations

from collections.abc import Sequence

from aggzoo.models.heads.afa import AFA

__all__ = ["IDA"]


class IDA(AFA):
    """IDA fusion of several backbone levels, then GeM -> (Linear) -> L2.

    Args:
        in_channels: channels ``(C_1, ..., C_L)`` of the levels, fine -> coarse (L >= 2).
        dim: fused width; default ``C_L``.
        fuse_level: index of the level whose resolution the fusion runs at (-1: coarsest).
        p: GeM exponent init (3).
        proj_dim: if set, a Linear ``dim -> proj_dim`` before the final L2; ``D = proj_dim or dim``.

    Shapes: ``Features(maps=(f_1, ..., f_L)) -> [B, D]``, ``f_l: [B, C_l, H_l, W_l]``, L >= 2.
    """

    def __init__(self, in_channels: Sequence[int], *, dim: int | None = None, fuse_level: int = -1, p: float = 3.0,
                 proj_dim: int | None = None) -> None:
        super().__init__(in_channels, dim=dim, attention=False, fuse_level=fuse_level, p=p, proj_dim=proj_dim)
