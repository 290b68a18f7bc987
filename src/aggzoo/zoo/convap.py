"""ConvAP: conv-and-pool aggregation, with the authors' released weights.

A. Ali-bey, B. Chaib-draa, P. Giguere, "GSV-Cities: Toward Appropriate Supervised Visual Place
Recognition", Neurocomputing 2022, arXiv:2210.10239. Original code: amaralibey/gsv-cities (no
licence file; names and shapes only).

Upstream facts of the released checkpoints:

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
from typing import Any

from torch import Tensor, nn

from aggzoo.hub.cfg import PretrainedCfg
from aggzoo.hub.registry import register_model
from aggzoo.hub.remap import rename
from aggzoo.models.heads.convap import ConvAP
from aggzoo.zoo._backbones import EFFICIENTNET_LITE0, RESNET50_LAYER4, head, resnet_rules, vpr

__all__ = ["convap_efficientnet_lite0", "convap_resnet50", "convert_convap"]

_AGGREGATOR_RULES = [(r"aggregator\.channel_pool\.(weight|bias)", r"head.channel_pool.\1")]


def convert_convap(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """``resnet50_ConvAP_<d>_2x2.ckpt`` keys -> ``convap_resnet50`` keys."""
    return rename(state, resnet_rules("backbone.model.", sequential=False) + _AGGREGATOR_RULES,
                  what="ConvAP (amaralibey/gsv-cities)")


# descriptor size -> (tag, d, published R@1 Pitts250k/Pitts30k/MSLS-val/Nordland, interpolation)
_RELEASES = {
    4096: ("official", 1024, (92.5, 90.5, 83.5, 42.6), "bicubic"),
    8192: ("official_8192", 2048, (92.8, 90.5, 83.1, 42.7), "bilinear"),
    2048: ("official_2048", 512, (92.3, 90.6, 83.4, 40.3), "bicubic"),
    512: ("official_512", 128, (90.7, 89.1, 82.6, 36.3), "bicubic"),
}

pretrained_cfgs = {
    f"convap_resnet50.{tag}": PretrainedCfg(
        download_page="https://drive.google.com/drive/folders/1VYPw9uGD11NgiGFgfWueLt3noJYOIuhL",
        filename=f"resnet50_ConvAP_{d}_2x2.ckpt",
        remap=convert_convap, model_kwargs={"out_channels": d},
        input_size=(3, 320, 320), interpolation=interpolation, out_dim=dim,
        recipe="amaralibey/gsv-cities main.py: GSV-Cities, 320x320, Adam 2e-4, 30 epochs",
        license="no licence stated (amaralibey/gsv-cities has no LICENSE file)",
        paper="GSV-Cities: Toward Appropriate Supervised Visual Place Recognition (Ali-bey et al., "
              "Neurocomputing 2022), arXiv:2210.10239",
        code="https://github.com/amaralibey/gsv-cities",
        metrics={"pitts250k_test/R@1": p250, "pitts30k_test/R@1": p30, "msls_val/R@1": msls,
                 "nordland/R@1": nordland},
        notes="README: the 4096-D model was trained with bicubic resizing, the 8192-D one with bilinear.",
    )
    for dim, (tag, d, (p250, p30, msls, nordland), interpolation) in _RELEASES.items()
}

_CONVAP = head(ConvAP)


@register_model
def convap_resnet50(**kwargs: Any) -> nn.Module:
    """ConvAP (Conv1x1 2048 -> d = 1024, 2 x 2 average pooling) on ResNet-50 layer4: 4096-D."""
    return vpr(RESNET50_LAYER4, _CONVAP, **kwargs)


@register_model
def convap_efficientnet_lite0(**kwargs: Any) -> nn.Module:
    """ConvAP (d = 1024, 2 x 2) on EfficientNet-Lite0 (stride 16): 4096-D."""
    return vpr(EFFICIENTNET_LITE0, _CONVAP, **kwargs)
