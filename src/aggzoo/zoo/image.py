"""ImAge: aggregation tokens inside DINOv2 ViT-B/14 (4 registers), with the authors' released weights."""

from __future__ import annotations

from typing import Any

from torch import nn

from aggzoo.convert.image import convert_image
from aggzoo.pretrained import PretrainedCfg
from aggzoo.registry import register_model, register_pretrained
from aggzoo.zoo._specs import DINOV2_EVAL_SIZE, DINOV2_VITB14_REG4_TOKENS, head, vpr

__all__ = ["image_dinov2_vitb14_reg4"]


@register_model
def image_dinov2_vitb14_reg4(**kwargs: Any) -> nn.Module:
    """ImAge: T = 8 aggregation tokens inserted before block 8 of DINOv2 ViT-B/14-reg4, flattened: 6144-D."""
    return vpr(DINOV2_VITB14_REG4_TOKENS, head("image_tokens.ImAgeTokens", num_tokens=8), **kwargs)


_PAPER = ("Towards Implicit Aggregation: Robust Image Representation for Place Recognition in the Transformer Era "
          "(Lu et al., NeurIPS 2025), arXiv:2511.06024")
_RELEASES = {
    "official": ("ImAge_GSV.pth", "GSV-Cities",
                 {"pitts30k_test/R@1": 94.0, "msls_val/R@1": 93.0, "nordland_10frames/R@1": 93.2}),
    "official_merged": ("ImAge_Merged.pth", "the unified (merged) dataset",
                        {"pitts30k_test/R@1": 94.1, "msls_val/R@1": 94.5, "nordland_10frames/R@1": 97.7}),
}

for _tag, (_file, _data, _metrics) in _RELEASES.items():
    register_pretrained(f"image_dinov2_vitb14_reg4.{_tag}", PretrainedCfg(
        hf_hub_id="fenglu96/ImAge4VPR", hf_hub_filename=_file,
        url=f"https://github.com/Lu-Feng/ImAge/releases/download/v1.0.0/{_file}",
        remap=convert_image,
        input_size=(3, DINOV2_EVAL_SIZE, DINOV2_EVAL_SIZE), interpolation="bicubic", out_dim=6144,
        recipe=f"Lu-Feng/ImAge train.py --freeze_te=8 --num_learnable_aggregation_tokens=8 on {_data}",
        license="MIT (Lu-Feng/ImAge)", paper=_PAPER, code="https://github.com/Lu-Feng/ImAge",
        metrics=_metrics,
        notes="Evaluated at 322x322 (parser.py --resize default). Checkpoint: {'model_state_dict'} with "
              "'module.' prefixes (DataParallel).",
    ))
