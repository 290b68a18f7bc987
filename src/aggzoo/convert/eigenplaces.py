"""EigenPlaces official checkpoints (gmberton/EigenPlaces release v1.0) -> ``eigenplaces_resnet{50,101}``.

Upstream facts (gmberton/EigenPlaces, MIT): ``eigenplaces_model/eigenplaces_network.py`` defines
``GeoLocalizationNet_`` with CosPlace's exact layout -- ``backbone = nn.Sequential(*list(resnet.
children())[:-2])`` and ``aggregation = Sequential(L2Norm, GeM, Flatten, Linear(2048, dim),
L2Norm)`` -- and ``hubconf.py`` loads ``.../EigenPlaces/releases/download/v1.0/<Backbone>_<dim>_eigenplaces.pth``
(raw state dict) strictly. ``AVAILABLE_TRAINED_MODELS`` in ``hubconf.py``: ResNet50 and ResNet101
at 128/256/512/1024/2048, ResNet18 at 256/512, VGG16 at 512 (the README omits 1024).
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor, nn

from aggzoo.convert.common import rename
from aggzoo.convert.cosplace import GEOLOCALIZATION_NET_RULES

__all__ = ["convert_eigenplaces"]


def convert_eigenplaces(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """``<Backbone>_<dim>_eigenplaces.pth`` keys -> ``eigenplaces_resnet*`` keys."""
    return rename(state, GEOLOCALIZATION_NET_RULES, what="EigenPlaces (gmberton/EigenPlaces)")
