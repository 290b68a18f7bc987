"""MixVPR official checkpoints (amaralibey/MixVPR, Google Drive) -> ``mixvpr_resnet50``.

Upstream facts (amaralibey/MixVPR, no licence file; names and shapes only):

- README: ``VPRModel(backbone_arch="resnet50", layers_to_crop=[4], agg_arch="MixVPR", ...)`` then
  ``model.load_state_dict(torch.load("resnet50_MixVPR_4096_channels(1024)_rows(4).ckpt"))``.
- ``models/backbones/resnet.py``: ``self.model = torchvision.models.resnet50(...)`` with ``fc``,
  ``avgpool`` and (cropped) ``layer4`` set to ``None`` -> ``backbone.model.{conv1, bn1,
  layer1..layer3}.*``.
- ``models/aggregators/mixvpr.py``: ``mix.{i}`` = FeatureMixerLayer with ``mix = Sequential(
  LayerNorm(400), Linear(400, 400), ReLU, Linear(400, 400))`` -> ``aggregator.mix.{i}.mix.{0,1,3}``;
  ``aggregator.channel_proj`` Linear(1024 -> d), ``aggregator.row_proj`` Linear(400 -> r).
- Variants (gmberton/VPR-methods-evaluation ``vpr_models/mixvpr.py``): 4096 = d 1024 x r 4,
  512 = 256 x 2, 128 = 64 x 2; all mix_depth 4, input 320 x 320.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor, nn

from aggzoo.convert.backbones import resnet_rules
from aggzoo.convert.common import rename

__all__ = ["convert_mixvpr"]

_AGGREGATOR_RULES = [(r"aggregator\.((?:mix\.\d+\.mix\.[013]|channel_proj|row_proj)\.(?:weight|bias))", r"head.\1")]


def convert_mixvpr(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """``resnet50_MixVPR_*.ckpt`` keys -> ``mixvpr_resnet50`` keys."""
    return rename(state, resnet_rules("backbone.model.", sequential=False) + _AGGREGATOR_RULES,
                  what="MixVPR (amaralibey/MixVPR)")
