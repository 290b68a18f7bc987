"""ImAge: learnable aggregation tokens inside DINOv2 ViT-B/14 (4 registers), with the authors' weights.

F. Lu et al., "Towards Implicit Aggregation: Robust Image Representation for Place Recognition in
the Transformer Era", NeurIPS 2025, arXiv:2511.06024. Original code: Lu-Feng/ImAge (MIT); weights
on Hugging Face ``fenglu96/ImAge4VPR``.

Upstream facts of ``ImAge_GSV.pth`` / ``ImAge_Merged.pth``:

- ``hubconf.py``: wraps ``network.VPRmodel`` in ``torch.nn.DataParallel`` and loads the files via
  ``["model_state_dict"]``: every key starts with ``module.``.
- ``network.py``: ``self.backbone = vit_base(patch_size=14, img_size=518, init_values=1,
  block_chunks=0, num_register_tokens=4)`` (DINOv2 with registers: ``backbone.{cls_token,
  pos_embed [1, 1370, 768], register_tokens [1, 4, 768], mask_token, patch_embed.proj,
  blocks.{0..11}.*, norm}``) and ``self.learnable_aggregation_tokens`` [1, 8, 768], prepended to
  [CLS, registers, patches] before block ``freeze_te = 8``; descriptor = flatten(norm(x)[:, :8]).
- That ``vit_base`` call keeps DINOv2's class defaults ``interpolate_offset=0.1``,
  ``interpolate_antialias=False`` (the torch.hub *register* models would use 0.0 / True instead), so
  the position embedding is resampled the same way as for the models without registers.
  Checked: upstream ImAge forward vs the converted model, random weights, 322 x 322: max |diff| 0.0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from aggzoo.hub.cfg import PretrainedCfg
from aggzoo.hub.registry import register_model
from aggzoo.hub.remap import rename
from aggzoo.models.heads.image import ImAgeTokens
from aggzoo.zoo._backbones import (
    DINOV2_EVAL_SIZE,
    DINOV2_VITB14_REG4_TOKENS,
    adapt_dinov2_embeddings,
    dinov2_rules,
    head,
    vpr,
)

__all__ = ["convert_image", "image_dinov2_vitb14_reg4"]


def convert_image(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """``ImAge_*.pth`` keys (``module.`` already removed) -> ``image_dinov2_vitb14_reg4`` keys."""
    rules = dinov2_rules("backbone.") + [(r"learnable_aggregation_tokens", "backbone.aggregation_tokens")]
    out = rename(state, rules, what="ImAge (Lu-Feng/ImAge)")
    return adapt_dinov2_embeddings(out, model)


_PAPER = ("Towards Implicit Aggregation: Robust Image Representation for Place Recognition in the Transformer Era "
          "(Lu et al., NeurIPS 2025), arXiv:2511.06024")
_RELEASES = {
    "official": ("ImAge_GSV.pth", "GSV-Cities",
                 {"pitts30k_test/R@1": 94.0, "msls_val/R@1": 93.0, "nordland_10frames/R@1": 93.2}),
    "official_merged": ("ImAge_Merged.pth", "the unified (merged) dataset",
                        {"pitts30k_test/R@1": 94.1, "msls_val/R@1": 94.5, "nordland_10frames/R@1": 97.7}),
}

pretrained_cfgs = {
    f"image_dinov2_vitb14_reg4.{tag}": PretrainedCfg(
        hf_hub_id="fenglu96/ImAge4VPR", hf_hub_filename=file,
        url=f"https://github.com/Lu-Feng/ImAge/releases/download/v1.0.0/{file}",
        remap=convert_image,
        input_size=(3, DINOV2_EVAL_SIZE, DINOV2_EVAL_SIZE), interpolation="bicubic", out_dim=6144,
        recipe=f"Lu-Feng/ImAge train.py --freeze_te=8 --num_learnable_aggregation_tokens=8 on {data}",
        license="MIT (Lu-Feng/ImAge)", paper=_PAPER, code="https://github.com/Lu-Feng/ImAge",
        metrics=metrics,
        notes="Evaluated at 322x322 (parser.py --resize default). Checkpoint: {'model_state_dict'} with "
              "'module.' prefixes (DataParallel).",
    )
    for tag, (file, data, metrics) in _RELEASES.items()
}


@register_model
def image_dinov2_vitb14_reg4(**kwargs: Any) -> nn.Module:
    """ImAge: T = 8 aggregation tokens inserted before block 8 of DINOv2 ViT-B/14-reg4, flattened: 6144-D."""
    return vpr(DINOV2_VITB14_REG4_TOKENS, head(ImAgeTokens), **kwargs)
