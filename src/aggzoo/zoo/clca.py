"""CLCA: the cross-layer aggregation head of CLCA as a retrieval head, on DINOv2 ViT-B/14.

E. A. Rios, J. C. Yuanda, V. L. Ghanz, C.-W. Yu, B.-C. Lai, M.-C. Hu, "Cross-Layer Cache Aggregation for
Token Reduction in Ultra-Fine-Grained Image Recognition", ICASSP 2025, arXiv:2501.00243; code
arkel23/CLCA (MIT). A classification method (no VPR weights exist); the entry has no pretrained_cfg.

As the authors' plain ViT (``models/vit.py``, reduction_loc 3, 6, 9 hard-coded), the head reads the CLS
after blocks 3, 6, 9 and 11 (0-based) with no final norm (their head replaces it by Identity).

Not implemented: the cross-layer cache (``--clc``). It serves token-reduction ViTs (EViT & co., which
drop patches): carrier tokens appended after the patches and the patch mean cached after each block,
re-appended at recovery layers. It changes the backbone's forward (sequence length per block) and
only matters once patches are pruned; none of the zoo's backbones prunes tokens, and VPR heads read
the patch maps, which a pruned and re-grown sequence no longer gives as an H x W grid.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from aggzoo.hub.registry import register_model
from aggzoo.models.heads.clca import CLCA
from aggzoo.zoo._backbones import DINOV2_VITB14, head, vpr

__all__ = ["clca_dinov2_vitb14"]


@register_model
def clca_dinov2_vitb14(**kwargs: Any) -> nn.Module:
    """CLCA over the CLS of DINOv2 ViT-B/14 blocks 3, 6, 9, 11 (no final norm), k = 2, Conv1d 1536 -> 768: 768-D."""
    return vpr(dict(DINOV2_VITB14, out_indices=[3, 6, 9, 11], final_norm=False), head(CLCA), **kwargs)
