"""SALAD official checkpoint (serizba/salad ``dino_salad.ckpt``) -> ``salad_dinov2_vitb14``.

Upstream facts (serizba/salad, GPL-3.0; names and shapes only, no code):

- ``hubconf.py`` builds ``VPRModel(backbone_arch="dinov2_vitb14", agg_arch="SALAD")`` and loads the
  release file with ``model.load_state_dict(...)`` directly: the file is a raw state dict.
- ``vpr_model.py``: the LightningModule holds ``self.backbone`` and ``self.aggregator``.
- ``models/backbones/dinov2.py``: ``self.model = torch.hub.load("facebookresearch/dinov2", ...)``, so
  the backbone keys are ``backbone.model.<DINOv2 hub names>`` (``cls_token``, ``pos_embed``
  [1, 1370, 768], ``mask_token``, ``patch_embed.proj``, ``blocks.{0..11}.*``, ``norm``); the final
  norm is applied (``norm_layer=True``) and the CLS token returned.
- ``models/aggregators/salad.py``: ``token_features`` = Sequential(Linear(768, 512), ReLU,
  Linear(512, 256)) -> indices 0, 2; ``cluster_features`` and ``score`` = Sequential(Conv1x1(768,
  512), Dropout, ReLU, Conv1x1(512, 128 | 64)) -> indices 0, 3; scalar ``dust_bin``.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor, nn

from aggzoo.convert.backbones import adapt_dinov2_embeddings, dinov2_rules
from aggzoo.convert.common import rename

__all__ = ["SALAD_AGGREGATOR_RULES", "convert_salad"]

SALAD_AGGREGATOR_RULES = [
    (r"aggregator\.((?:token_features\.[02]|cluster_features\.[03]|score\.[03])\.(?:weight|bias)|dust_bin)",
     r"head.\1"),
]


def convert_salad(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """serizba/salad ``dino_salad.ckpt`` keys -> ``salad_dinov2_vitb14`` keys."""
    out = rename(state, dinov2_rules("backbone.model.") + SALAD_AGGREGATOR_RULES, what="SALAD (serizba/salad)")
    return adapt_dinov2_embeddings(out, model)
