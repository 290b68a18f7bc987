"""CosPlace official checkpoints (gmberton/CosPlace release v1.0) -> ``cosplace_resnet{50,101}``.

Upstream facts (gmberton/CosPlace, MIT):

- ``hubconf.py``: ``GeoLocalizationNet(backbone, fc_output_dim)`` loads
  ``https://github.com/gmberton/CosPlace/releases/download/v1.0/<ResNet50|ResNet101|...>_<dim>_cosplace.pth``
  (a raw state dict) with ``load_state_dict``.
- ``cosplace_model/cosplace_network.py``: ``backbone = nn.Sequential(*list(resnet.children())[:-2])``
  -> ``backbone.{0 conv1, 1 bn1, 4..7 layer1..layer4}.*``; ``aggregation = Sequential(L2Norm, GeM,
  Flatten, Linear(2048, dim), L2Norm)`` -> ``aggregation.1.p`` [1] and ``aggregation.3.{weight
  [dim, 2048], bias}``.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor, nn

from aggzoo.convert.backbones import resnet_rules
from aggzoo.convert.common import Rule, rename

__all__ = ["GEOLOCALIZATION_NET_RULES", "convert_cosplace"]

#: gmberton's GeoLocalizationNet layout (CosPlace, EigenPlaces): Sequential ResNet + GeM/FC head.
GEOLOCALIZATION_NET_RULES: list[Rule] = resnet_rules("backbone.", sequential=True) + [
    (r"aggregation\.(1\.p|3\.weight|3\.bias)", r"head.aggregation.\1"),
]


def convert_cosplace(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """``<Backbone>_<dim>_cosplace.pth`` keys -> ``cosplace_resnet*`` keys."""
    return rename(state, GEOLOCALIZATION_NET_RULES, what="CosPlace (gmberton/CosPlace)")
