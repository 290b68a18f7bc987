"""ConvAP official checkpoints (amaralibey/gsv-cities, Google Drive) -> ``convap_resnet50``.

Upstream facts (amaralibey/gsv-cities, no licence file; names and shapes only):

- README: ``VPRModel(backbone_arch="resnet50", layers_to_crop=[], agg_arch="ConvAP",
  agg_config={"in_channels": 2048, "out_channels": 1024, "s1": 2, "s2": 2})`` then
  ``model.load_state_dict(torch.load("./LOGS/resnet50_ConvAP_1024_2x2.ckpt"))``.
- ``models/backbones/resnet.py``: ``self.model = torchvision.models.resnet50(...)``, ``fc`` and
  ``avgpool`` set to ``None``, layer4 kept -> ``backbone.model.{conv1, bn1, layer1..layer4}.*``.
- ``models/aggregators/convap.py``: ``channel_pool = Conv2d(2048, d, 1, bias=True)`` ->
  ``aggregator.channel_pool.{weight [d, 2048, 1, 1], bias [d]}``; AdaptiveAvgPool2d((2, 2)).
- Released files (README table): d = 2048 / 1024 / 512 / 128 -> 8192 / 4096 / 2048 / 512-D.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor, nn

from aggzoo.convert.backbones import resnet_rules
from aggzoo.convert.common import rename

__all__ = ["convert_convap"]

_AGGREGATOR_RULES = [(r"aggregator\.channel_pool\.(weight|bias)", r"head.channel_pool.\1")]


def convert_convap(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """``resnet50_ConvAP_<d>_2x2.ckpt`` keys -> ``convap_resnet50`` keys."""
    return rename(state, resnet_rules("backbone.model.", sequential=False) + _AGGREGATOR_RULES,
                  what="ConvAP (amaralibey/gsv-cities)")
