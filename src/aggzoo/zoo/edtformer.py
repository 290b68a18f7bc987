"""EDTformer: an efficient decoder head on DINOv2 with LoPA adapters, with the authors' weights.

T. Jin, F. Lu, S. Hu, C. Yuan, Y. Liu, "EDTformer: An Efficient Decoder Transformer for Visual
Place Recognition", IEEE TCSVT 2025, arXiv:2412.00784. Original code: Tong-Jin01/EDTformer (MIT).

Upstream facts of ``EDTformer.pth``:

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
from typing import Any

from torch import Tensor, nn

from aggzoo.hub.cfg import PretrainedCfg
from aggzoo.hub.registry import register_model
from aggzoo.hub.remap import rename
from aggzoo.models.heads.edtformer import EDTformer
from aggzoo.zoo._backbones import DINOV2_EVAL_SIZE, DINOV2_VITB14_LOPA, adapt_dinov2_embeddings, dinov2_rules, head, vpr

__all__ = ["convert_edtformer", "edtformer_dinov2_vitb14"]

_RULES = [
    (r"backbone\.adapters\.(\d+)\.D_fc([12])\.(weight|bias)", r"backbone.adapters.\1.fc\2.\3"),
    (r"((?:fc|channel_proj|row_proj)\.(?:weight|bias)|queries)", r"head.\1"),
    (r"(decoder\.layers\.\d+\.(?:self_attn|multihead_attn|norm1|norm2)\..+)", r"head.\1"),
]


def convert_edtformer(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """``EDTformer.pth`` keys (``module.`` already removed) -> ``edtformer_dinov2_vitb14`` keys."""
    out = rename(state, _RULES + dinov2_rules("backbone."), what="EDTformer (Tong-Jin01/EDTformer)")
    return adapt_dinov2_embeddings(out, model)


pretrained_cfgs = {
    "edtformer_dinov2_vitb14.official": PretrainedCfg(
        url="https://github.com/Tong-Jin01/EDTformer/releases/download/v1.0.0/EDTformer.pth",
        download_page="https://drive.google.com/file/d/1T7qmq1NtA8NgN8uLrrgsckxMLX_nWDJb/view",
        filename="EDTformer.pth",
        remap=convert_edtformer,
        input_size=(3, DINOV2_EVAL_SIZE, DINOV2_EVAL_SIZE), interpolation="bicubic", out_dim=4096,
        recipe="Tong-Jin01/EDTformer train.py: GSV-Cities, DINOv2 frozen, LoPA adapters and decoder trained",
        license="MIT (Tong-Jin01/EDTformer)",
        paper="EDTformer: An Efficient Decoder Transformer for Visual Place Recognition (Jin et al., IEEE TCSVT "
              "2025), arXiv:2412.00784",
        code="https://github.com/Tong-Jin01/EDTformer",
        notes="Evaluated at 322x322 (parser.py --resize default). Checkpoint: {'model_state_dict'} with 'module.' "
              "prefixes (DataParallel). No published figure is recorded in REFERENCE.md.",
    ),
}


@register_model
def edtformer_dinov2_vitb14(**kwargs: Any) -> nn.Module:
    """EDTformer: frozen DINOv2 ViT-B/14 with LoPA adapters (r = 4), then Q = 64 queries through 2 simplified
    decoder blocks, d = 256, R = 16: 4096-D."""
    return vpr(DINOV2_VITB14_LOPA, head(EDTformer), **kwargs)
