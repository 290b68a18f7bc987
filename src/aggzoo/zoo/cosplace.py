"""CosPlace: GeM + FC on a ResNet trained by classification of geographic groups, with the authors' weights.

G. Berton, C. Masone, B. Caputo, "Rethinking Visual Geo-localization for Large-Scale Applications",
CVPR 2022, arXiv:2204.02287. Original code: gmberton/CosPlace (MIT).

Upstream facts of the released checkpoints (gmberton/CosPlace release v1.0):

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
from typing import Any

from torch import Tensor, nn

from aggzoo.hub.cfg import PretrainedCfg
from aggzoo.hub.registry import register_model
from aggzoo.hub.remap import Rule, rename
from aggzoo.models.heads.cosplace import CosPlace
from aggzoo.zoo._backbones import RESNET50_LAYER4, RESNET101_LAYER4, head, resnet_rules, vpr

__all__ = ["GEOLOCALIZATION_NET_RULES", "convert_cosplace", "cosplace_resnet101", "cosplace_resnet50",
           "geolocalization_net_cfgs"]

#: gmberton's GeoLocalizationNet layout (CosPlace, EigenPlaces): Sequential ResNet + GeM/FC head.
GEOLOCALIZATION_NET_RULES: list[Rule] = resnet_rules("backbone.", sequential=True) + [
    (r"aggregation\.(1\.p|3\.weight|3\.bias)", r"head.aggregation.\1"),
]


def convert_cosplace(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """``<Backbone>_<dim>_cosplace.pth`` keys -> ``cosplace_resnet*`` keys."""
    return rename(state, GEOLOCALIZATION_NET_RULES, what="CosPlace (gmberton/CosPlace)")


def geolocalization_net_cfgs(method: str, repo: str, remap: Any, dims: Mapping[str, tuple[int, ...]], *,
                             paper: str, recipe: str,
                             metrics: Mapping[tuple[str, int], Mapping[str, float]]) -> dict[str, PretrainedCfg]:
    """The ``pretrained_cfgs`` of one of gmberton's GeoLocalizationNet repositories (CosPlace,
    EigenPlaces): one tag per (ResNet, descriptor size) its ``hubconf.py`` publishes."""
    cfgs = {}
    for backbone, sizes in dims.items():
        for dim in sorted(sizes, key=lambda d: d != 2048):  # the full-size release is the default tag
            tag = "official" if dim == 2048 else f"official_{dim}"
            cfgs[f"{method}_{backbone.lower()}.{tag}"] = PretrainedCfg(
                url=f"https://github.com/gmberton/{repo}/releases/download/v1.0/{backbone}_{dim}_{method}.pth",
                remap=remap, model_kwargs={"out_dim": dim},
                input_size=(3, 480, 640), interpolation="bilinear", out_dim=dim,
                recipe=f"gmberton/{repo} train.py: {recipe}",
                license=f"MIT (gmberton/{repo})", paper=paper, code=f"https://github.com/gmberton/{repo}",
                metrics=metrics.get((backbone, dim), {}),
                notes="Evaluated on full-resolution 480x640 images (no resize).",
            )
    return cfgs


# hubconf.py AVAILABLE_TRAINED_MODELS (ResNet entries); published R@1 from REFERENCE.md section 5.
pretrained_cfgs = geolocalization_net_cfgs(
    "cosplace", "CosPlace", convert_cosplace,
    {"ResNet50": (32, 64, 128, 256, 512, 1024, 2048), "ResNet101": (32, 64, 128, 256, 512, 1024, 2048)},
    paper="Rethinking Visual Geo-localization for Large-Scale Applications (Berton, Masone & Caputo, CVPR 2022), "
          "arXiv:2204.02287",
    recipe="SF-XL, CosPlace classification groups",
    metrics={("ResNet101", 2048): {"pitts30k_test/R@1": 90.4, "msls_val/R@1": 86.6}},
)

_GEM_FC = head(CosPlace, out_dim=2048)


@register_model
def cosplace_resnet50(**kwargs: Any) -> nn.Module:
    """CosPlace (L2 -> GeM -> Linear -> L2) on ResNet-50 layer4: 2048-D."""
    return vpr(RESNET50_LAYER4, _GEM_FC, **kwargs)


@register_model
def cosplace_resnet101(**kwargs: Any) -> nn.Module:
    """CosPlace on ResNet-101 layer4: 2048-D."""
    return vpr(RESNET101_LAYER4, _GEM_FC, **kwargs)
