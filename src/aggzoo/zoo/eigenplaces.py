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

EigenPlaces-indoor (Enrico-Chiavassa/Indoor-VPR, MIT): the ResNet-50 2048-D model fine-tuned on indoor
data. ``model/network.py``: ``GeoLocalizationNet`` holds ``self.model = torch.hub.load("gmberton/
eigenplaces", "get_trained_model", ...)``, so its file is EigenPlaces' layout under ``model.``;
``hubconf.py`` loads ``.../Indoor-VPR/releases/download/v0.1.0/eigenplaces_ResNet50_2048_<variation>.pth``
(raw state dict) strictly, variation 0 = ``GB1_BAI_5_10`` (its default), 1 = ``GB1_BAI_10_25_S``; per its
comment the two differ in the fine-tuning data, the soft/hard positive thresholds and the image handling.
VPR-methods-evaluation (``eigenplaces-indoor``) evaluates it at full resolution. The checkpoint reader drops
the ``model.`` wrapper (:func:`aggzoo.hub.checkpoint.unwrap_checkpoint`: ``model.backbone.*`` is a wrapped
model), so EigenPlaces' converter reads these files as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from aggzoo.hub.cfg import PretrainedCfg
from aggzoo.hub.registry import register_model
from aggzoo.hub.remap import rename
from aggzoo.models.heads.cosplace import CosPlace
from aggzoo.zoo._backbones import RESNET50_LAYER4, RESNET101_LAYER4, head, vpr
from aggzoo.zoo.cosplace import GEOLOCALIZATION_NET_RULES, geolocalization_net_cfgs

__all__ = ["INDOOR_VPR_CODE", "convert_eigenplaces", "eigenplaces_resnet101",
           "eigenplaces_resnet50", "indoor_vpr_cfg"]


def convert_eigenplaces(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """``<Backbone>_<dim>_eigenplaces.pth`` keys -> ``eigenplaces_resnet*`` keys."""
    return rename(state, GEOLOCALIZATION_NET_RULES, what="EigenPlaces (gmberton/EigenPlaces)")


INDOOR_VPR_CODE = "https://github.com/Enrico-Chiavassa/Indoor-VPR"


def indoor_vpr_cfg(stem: str, variation: tuple[int, str], *, remap: Any, method: str, **fields: Any) -> PretrainedCfg:
    """The cfg of the Indoor-VPR release ``<stem>_<name>.pth``, ``variation = (index, name)`` as in its
    ``hubconf.py`` (``get_trained_model(method, ..., variation=index)``, ``AVAILABLE_VARIATIONS[stem]``)."""
    index, name = variation
    return PretrainedCfg(
        url=f"{INDOOR_VPR_CODE}/releases/download/v0.1.0/{stem}_{name}.pth",
        remap=remap,
        recipe=f"Enrico-Chiavassa/Indoor-VPR: {method} fine-tuned on indoor data (Gangnam Station B1-B2, Hyundai "
               f"Department Store B1-1F-4F, Baidu Mall), variation {index} {name}; per hubconf.py the variations differ "
               "in the fine-tuning data, the soft/hard positive thresholds and the image handling (which is which in "
               "the name: not stated upstream)",
        license="MIT (Enrico-Chiavassa/Indoor-VPR)",
        code=INDOOR_VPR_CODE,
        metrics={},  # the repository publishes no figures and names no paper (README, 2026-12-02)
        **fields,
    )


pretrained_cfgs = geolocalization_net_cfgs(
    "eigenplaces", "EigenPlaces", convert_eigenplaces,
    {"ResNet50": (128, 256, 512, 1024, 2048), "ResNet101": (128, 256, 512, 1024, 2048)},
    paper="EigenPlaces: Training Viewpoint Robust Models for Visual Place Recognition (Berton et al., ICCV 2023), "
          "arXiv:2308.10832",
    recipe="SF-XL panoramas, EigenPlaces lateral/frontal losses",
    metrics={},
)
# Indoor-VPR hubconf AVAILABLE_VARIATIONS["eigenplaces_ResNet50_2048"]; the default variation gets the plain tag.
for _tag, _variation in (("indoor", (0, "GB1_BAI_5_10")), ("indoor_gb1_bai_10_25_s", (1, "GB1_BAI_10_25_S"))):
    pretrained_cfgs[f"eigenplaces_resnet50.{_tag}"] = indoor_vpr_cfg(
        "eigenplaces_ResNet50_2048", _variation, remap=convert_eigenplaces, method="EigenPlaces ResNet-50 2048-D",
        input_size=(3, 480, 640), interpolation="bilinear", out_dim=2048,
        paper="EigenPlaces: Training Viewpoint Robust Models for Visual Place Recognition (Berton et al., ICCV 2023), "
              "arXiv:2308.10832 (the architecture; the indoor fine-tuning has no paper)",
        notes="Evaluated at full resolution, as VPR-methods-evaluation's eigenplaces-indoor. The file is EigenPlaces' "
              "state dict under model. (Indoor-VPR model/network.py wraps the torch.hub EigenPlaces model); the "
              "checkpoint reader drops that prefix.",
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
