"""CosPlace and EigenPlaces (GeM + FC on ResNet layer4), with the authors' released weights."""

from __future__ import annotations

from typing import Any

from torch import nn

from aggzoo.convert.cosplace import convert_cosplace
from aggzoo.convert.eigenplaces import convert_eigenplaces
from aggzoo.pretrained import PretrainedCfg
from aggzoo.registry import register_model, register_pretrained
from aggzoo.zoo._specs import RESNET50_LAYER4, RESNET101_LAYER4, head, vpr

__all__ = ["cosplace_resnet101", "cosplace_resnet50", "eigenplaces_resnet101", "eigenplaces_resnet50"]


def _gem_fc(**kwargs: Any) -> dict[str, Any]:
    return head("cosplace.CosPlace", out_dim=2048, p=3.0, eps=1e-6, **kwargs)


@register_model
def cosplace_resnet50(**kwargs: Any) -> nn.Module:
    """CosPlace (L2 -> GeM -> Linear -> L2) on ResNet-50 layer4: 2048-D."""
    return vpr(RESNET50_LAYER4, _gem_fc(), **kwargs)


@register_model
def cosplace_resnet101(**kwargs: Any) -> nn.Module:
    """CosPlace on ResNet-101 layer4: 2048-D."""
    return vpr(RESNET101_LAYER4, _gem_fc(), **kwargs)


@register_model
def eigenplaces_resnet50(**kwargs: Any) -> nn.Module:
    """EigenPlaces (CosPlace's network, trained for viewpoint robustness) on ResNet-50 layer4: 2048-D."""
    return vpr(RESNET50_LAYER4, _gem_fc(), **kwargs)


@register_model
def eigenplaces_resnet101(**kwargs: Any) -> nn.Module:
    """EigenPlaces on ResNet-101 layer4: 2048-D."""
    return vpr(RESNET101_LAYER4, _gem_fc(), **kwargs)


# Published R@1 (REFERENCE.md section 5) for the files that have one recorded.
_METRICS = {("cosplace", "ResNet101", 2048): {"pitts30k_test/R@1": 90.4, "msls_val/R@1": 86.6}}
# hubconf.py AVAILABLE_TRAINED_MODELS of each repository (ResNet entries).
_DIMS = {
    "cosplace": {"ResNet50": (32, 64, 128, 256, 512, 1024, 2048), "ResNet101": (32, 64, 128, 256, 512, 1024, 2048)},
    "eigenplaces": {"ResNet50": (128, 256, 512, 1024, 2048), "ResNet101": (128, 256, 512, 1024, 2048)},
}
_UPSTREAM = {
    "cosplace": ("CosPlace", convert_cosplace,
                 "Rethinking Visual Geo-localization for Large-Scale Applications "
                 "(Berton, Masone & Caputo, CVPR 2022), arXiv:2204.02287",
                 "SF-XL, CosPlace classification groups"),
    "eigenplaces": ("EigenPlaces", convert_eigenplaces,
                    "EigenPlaces: Training Viewpoint Robust Models for Visual Place Recognition "
                    "(Berton et al., ICCV 2023), arXiv:2308.10832",
                    "SF-XL panoramas, EigenPlaces lateral/frontal losses"),
}

for _method, (_repo, _remap, _paper, _recipe) in _UPSTREAM.items():
    for _backbone, _dims in _DIMS[_method].items():
        for _dim in _dims:
            _tag = "official" if _dim == 2048 else f"official_{_dim}"
            register_pretrained(f"{_method}_{_backbone.lower()}.{_tag}", PretrainedCfg(
                url=f"https://github.com/gmberton/{_repo}/releases/download/v1.0/{_backbone}_{_dim}_{_method}.pth",
                remap=_remap, model_kwargs={"out_dim": _dim},
                input_size=(3, 480, 640), interpolation="bilinear", out_dim=_dim,
                recipe=f"gmberton/{_repo} train.py: {_recipe}",
                license=f"MIT (gmberton/{_repo})", paper=_paper, code=f"https://github.com/gmberton/{_repo}",
                metrics=_METRICS.get((_method, _backbone, _dim), {}),
                notes="Evaluated on full-resolution 480x640 images (no resize).",
            ))
