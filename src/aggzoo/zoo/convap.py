"""ConvAP on ResNet-50 (layer4) and EfficientNet-Lite0, with the authors' released weights."""

from __future__ import annotations

from typing import Any

from torch import nn

from aggzoo.convert.convap import convert_convap
from aggzoo.pretrained import PretrainedCfg
from aggzoo.registry import register_model, register_pretrained
from aggzoo.zoo._specs import EFFICIENTNET_LITE0, RESNET50_LAYER4, head, vpr

__all__ = ["convap_efficientnet_lite0", "convap_resnet50"]

_CONVAP = head("convap.ConvAP", out_channels=1024, s1=2, s2=2)


@register_model
def convap_resnet50(**kwargs: Any) -> nn.Module:
    """ConvAP (Conv1x1 2048 -> d = 1024, 2 x 2 average pooling) on ResNet-50 layer4: 4096-D."""
    return vpr(RESNET50_LAYER4, _CONVAP, **kwargs)


@register_model
def convap_efficientnet_lite0(**kwargs: Any) -> nn.Module:
    """ConvAP (d = 1024, 2 x 2) on EfficientNet-Lite0 (stride 16): 4096-D."""
    return vpr(EFFICIENTNET_LITE0, _CONVAP, **kwargs)


# descriptor size -> (tag, d, published R@1 Pitts250k/Pitts30k/MSLS-val/Nordland, interpolation)
_RELEASES = {
    4096: ("official", 1024, (92.5, 90.5, 83.5, 42.6), "bicubic"),
    8192: ("official_8192", 2048, (92.8, 90.5, 83.1, 42.7), "bilinear"),
    2048: ("official_2048", 512, (92.3, 90.6, 83.4, 40.3), "bicubic"),
    512: ("official_512", 128, (90.7, 89.1, 82.6, 36.3), "bicubic"),
}

for _dim, (_tag, _d, (_p250, _p30, _msls, _nordland), _interpolation) in _RELEASES.items():
    register_pretrained(f"convap_resnet50.{_tag}", PretrainedCfg(
        download_page="https://drive.google.com/drive/folders/1VYPw9uGD11NgiGFgfWueLt3noJYOIuhL",
        filename=f"resnet50_ConvAP_{_d}_2x2.ckpt",
        remap=convert_convap, model_kwargs={"out_channels": _d},
        input_size=(3, 320, 320), interpolation=_interpolation, out_dim=_dim,
        recipe="amaralibey/gsv-cities main.py: GSV-Cities, 320x320, Adam 2e-4, 30 epochs",
        license="no licence stated (amaralibey/gsv-cities has no LICENSE file)",
        paper="GSV-Cities: Toward Appropriate Supervised Visual Place Recognition (Ali-bey et al., "
              "Neurocomputing 2022), arXiv:2210.10239",
        code="https://github.com/amaralibey/gsv-cities",
        metrics={"pitts250k_test/R@1": _p250, "pitts30k_test/R@1": _p30, "msls_val/R@1": _msls,
                 "nordland/R@1": _nordland},
        notes="README: the 4096-D model was trained with bicubic resizing, the 8192-D one with bilinear.",
    ))
