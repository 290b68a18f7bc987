"""EDTformer: DINOv2 ViT-B/14 with LoPA adapters + the efficient decoder head, and the authors' weights."""

from __future__ import annotations

from typing import Any

from torch import nn

from aggzoo.convert.edtformer import convert_edtformer
from aggzoo.pretrained import PretrainedCfg
from aggzoo.registry import register_model, register_pretrained
from aggzoo.zoo._specs import DINOV2_EVAL_SIZE, DINOV2_VITB14_LOPA, head, vpr

__all__ = ["edtformer_dinov2_vitb14"]


@register_model
def edtformer_dinov2_vitb14(**kwargs: Any) -> nn.Module:
    """EDTformer: frozen DINOv2 ViT-B/14 with LoPA adapters (r = 4), then Q = 64 queries through 2 simplified
    decoder blocks, d = 256, R = 16: 4096-D."""
    spec = head("edtformer.EDTformer", num_queries=64, num_layers=2, num_heads=16, out_channels=256, out_rows=16,
                dropout=0.1)
    return vpr(DINOV2_VITB14_LOPA, spec, **kwargs)


register_pretrained("edtformer_dinov2_vitb14.official", PretrainedCfg(
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
))
