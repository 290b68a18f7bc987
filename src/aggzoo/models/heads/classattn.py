"""Class-attention pooling (PatchConvNet) as a VPR head.

H. Touvron, M. Cord, A. El-Nouby, P. Bojanowski, A. Joulin, G. Synnaeve, H. Jegou, "Augmenting
Convolutional networks with attention-based aggregation", arXiv:2112.13692. Original code:
facebookresearch/deit ``patchconvnet_models.py`` (CC BY-NC 4.0 in the version read);
re-implemented from the paper.

The paper replaces a CNN's global average pooling by one transformer block in which a learned
query token attends over the patches. Here the patches are the ``n = H*W`` positions of the last
map: ``x [B, C, H, W] -> tokens [B, n, C] -> ClassAttentionPool -> [B, C] -> (Linear) -> L2``.
Works on CNN maps and on ViT patch maps alike.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from aggzoo.layers.attention import ClassAttentionPool
from aggzoo.models.features import Features
from aggzoo.models.heads.base import Head

__all__ = ["ClassAttention"]


class ClassAttention(Head):
    """PatchConvNet attention-based aggregation of the last map.

    Args:
        in_channels: ``C`` of the last map (the token width).
        num_heads: attention heads (paper: 1).
        mlp_ratio: hidden width of the block's MLP over ``C`` (paper: 3).
        init_scale: layer-scale init of both residual branches (paper: 1e-6). At this value the
            descriptor starts as the normalised query token, the same for every image, and the gammas
            must grow before it tells images apart: a short retrieval fine-tune learns little
            (``conf/head/classattn.yaml`` has the measured figures); 1.0 trains at once.
        proj_dim: if set, a Linear ``C -> proj_dim`` before the final L2; ``D = proj_dim or C``.

    Shapes: ``Features(maps=(..., [B, C, H, W])) -> [B, D]``.
    """

    def __init__(
        self,
        in_channels: int,
        *,
        num_heads: int = 1,
        mlp_ratio: float = 3.0,
        init_scale: float = 1e-6,
        proj_dim: int | None = None,
    ) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.pool = ClassAttentionPool(in_channels, num_heads=num_heads, mlp_ratio=mlp_ratio, init_scale=init_scale)
        self.fc = nn.Linear(in_channels, proj_dim) if proj_dim else nn.Identity()
        self.out_dim = int(proj_dim or in_channels)

    def forward(self, features: Features) -> Tensor:
        tokens = features.last.flatten(2).transpose(1, 2)  # [B, n, C], row-major over (H, W)
        return F.normalize(self.fc(self.pool(tokens)), dim=-1)
