"""EigenPlaces: CosPlace's network trained for viewpoint robustness, with the authors' weights.

G. Berton, G. Trivigno, B. Caputo, C. Masone, "EigenPlaces: Training Viewpoint Robust Models for
Visual Place Recognition", ICCV 2023, arXiv:2308.10832. Original code: gmberton/EigenPlaces (MIT).
The head is CosPlace's (:class:`~aggzoo.models.heads.cosplace.CosPlace`, ``head=cosplace``); only the
training differs, so this method has a zoo file and no model file or head config of its own.

Upstream facts (gmberton/EigenPlaces): ``eigenplaces_model/eigenplaces_network.py`` defines
``GeoLocalizationNet_`` with CosPlace's exact layout -- ``backbone = nn.Sequential(*list(resnet.
children())[:-2])`` and ``aggregation = Sequential(L2Norm, GeM, Flatten, Linear(2048, dim),
L2Norm)`` -- and ``hubconf.py`` loads ``.../EigenPlaces/releases/download/v1.0/<Backbone>_<dim>_eigenplaces.pth``
(raw state dict) strictly. ``AVAILABLE_TRAINED_MODELS`` in ``hubconf.py``: ResNet50 and ResNet101
at 128/256/512/1024/2048, ResNet18 at 256/512, VGG16 at 512 (the README omits 1024).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from aggzoo.hub.registry import register_model
from aggzoo.hub.remap import rename
from aggzoo.models.heads.cosplace import CosPlace
from aggzoo.zoo._backbones import RESNET50_LAYER4, RESNET101_LAYER4, head, vpr
from aggzoo.zoo.cosplace import GEOLOCALIZATION_NET_RULES, geolocalization_net_cfgs

__all__ = ["convert_eigenplaces", "eigenplaces_resnet101", "eigenplaces_resnet50"]


def convert_eigenplaces(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """``<Backbone>_<dim>_eigenplaces.pth`` keys -> ``eigenplaces_resnet*`` keys."""
    return rename(state, GEOLOCALIZATION_NET_RULES, what="EigenPlaces (gmberton/EigenPlaces)")


pretrained_cfgs = geolocalization_net_cfgs(
    "eigenplaces", "EigenPlaces", convert_eigenplaces,
    {"ResNet50": (128, 256, 512, 1024, 2048), "ResNet101": (128, 256, 512, 1024, 2048)},
    paper="EigenPlaces: Training Viewpoint Robust Models for Visual Place Recognition (Berton et al., ICCV 2023), "
          "arXiv:2308.10832",
    recipe="SF-XL panoramas, EigenPlaces lateral/frontal losses",
    metrics={},
)

_GEM_FC = head(CosPlace, out_dim=2048)


@register_model
def eigenplaces_resnet50(**kwargs: Any) -> nn.Module:
    """EigenPlaces (CosPlace's network, trained for viewpoint robustness) on ResNet-50 layer4: 2048-D."""
    return vpr(RESNET50_LAYER4, _GEM_FC, **kwargs)


@register_model
def eigenplaces_resnet101(**kwargs: Any) -> nn.Module:
    """EigenPlaces on ResNet-101 layer4: 2048-D."""
    return vpr(RESNET101_LAYER4, _GEM_FC, **kwargs)
