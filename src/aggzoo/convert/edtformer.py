"""EDTformer official checkpoint (Tong-Jin01/EDTformer ``EDTformer.pth``) -> ``edtformer_dinov2_vitb14``.

Upstream facts (Tong-Jin01/EDTformer, MIT):

- ``hubconf.py``: wraps ``network.VPRNet()`` in ``torch.nn.DataParallel`` and loads the release file's
  ``["model_state_dict"]``: every key starts with ``module.``.
- ``network.py``: ``self.backbone = vit_base(patch_size=14, img_size=518, init_values=1,
  block_chunks=0)`` (DINOv2 names: ``backbone.{cls_token, pos_embed [1, 1370, 768], mask_token,
  patch_embed.proj, blocks.{0..11}.*, norm}``) plus ``backbone.adapters.{i}.D_fc{1,2}`` (LoPA,
  ``backbone/LadderAdapter.py``: Linear 768 -> 4 -> 768); the head is ``fc``, ``decoder.layers.{0,1}``
  (``SA_CA``: ``self_attn``, ``multihead_attn``, ``norm1``, ``norm2``; no feed-forward weights),
  ``queries [1, 64, 768]``, ``channel_proj`` and ``row_proj``.
- ``vit_base`` keeps DINOv2's ``interpolate_offset = 0.1``, so the position embedding is resampled to
  the 23 x 23 grid of 322 x 322 inputs (``parser.py --resize`` default) as for SALAD.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor, nn

from aggzoo.convert.backbones import adapt_dinov2_embeddings, dinov2_rules
from aggzoo.convert.common import rename

__all__ = ["convert_edtformer"]

_RULES = [
    (r"backbone\.adapters\.(\d+)\.D_fc([12])\.(weight|bias)", r"backbone.adapters.\1.fc\2.\3"),
    (r"((?:fc|channel_proj|row_proj)\.(?:weight|bias)|queries)", r"head.\1"),
    (r"(decoder\.layers\.\d+\.(?:self_attn|multihead_attn|norm1|norm2)\..+)", r"head.\1"),
]


def convert_edtformer(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """``EDTformer.pth`` keys (``module.`` already removed) -> ``edtformer_dinov2_vitb14`` keys."""
    out = rename(state, _RULES + dinov2_rules("backbone."), what="EDTformer (Tong-Jin01/EDTformer)")
    return adapt_dinov2_embeddings(out, model)
