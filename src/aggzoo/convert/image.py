"""ImAge official checkpoints (Lu-Feng/ImAge, Hugging Face ``fenglu96/ImAge4VPR``) -> ``image_dinov2_vitb14_reg4``.

Upstream facts (Lu-Feng/ImAge, MIT):

- ``hubconf.py``: wraps ``network.VPRmodel`` in ``torch.nn.DataParallel`` and loads
  ``ImAge_GSV.pth`` / ``ImAge_Merged.pth`` via ``["model_state_dict"]``: every key starts with
  ``module.``.
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

from torch import Tensor, nn

from aggzoo.convert.backbones import adapt_dinov2_embeddings, dinov2_rules
from aggzoo.convert.common import rename

__all__ = ["convert_image"]


def convert_image(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """``ImAge_*.pth`` keys (``module.`` already removed) -> ``image_dinov2_vitb14_reg4`` keys."""
    rules = dinov2_rules("backbone.") + [(r"learnable_aggregation_tokens", "backbone.aggregation_tokens")]
    out = rename(state, rules, what="ImAge (Lu-Feng/ImAge)")
    return adapt_dinov2_embeddings(out, model)
