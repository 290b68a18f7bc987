"""MixVPR: feature mixing over the positions of a fixed-size map, with the authors' weights (4096/512/128-D).

A. Ali-bey, B. Chaib-draa, P. Giguere, "MixVPR: Feature Mixing for Visual Place Recognition",
WACV 2023, arXiv:2303.02190. Original code: amaralibey/MixVPR (no licence file; names and shapes only).

Upstream facts of the released checkpoints:

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
from typing import Any

from torch import Tensor, nn

from aggzoo.hub.cfg import PretrainedCfg
from aggzoo.hub.registry import register_model
from aggzoo.hub.remap import rename
from aggzoo.models.heads.mixvpr import MixVPR
from aggzoo.zoo._backbones import RESNET50_LAYER3, head, resnet_rules, vpr

__all__ = ["MIXVPR_AGGREGATOR_RULES", "convert_mixvpr", "mixvpr_resnet50"]

#: amaralibey/MixVPR ``aggregator.*`` keys (also DINO-Mix's aggregator) -> ``head.*``
MIXVPR_AGGREGATOR_RULES = [(r"aggregator\.((?:mix\.\d+\.mix\.[013]|channel_proj|row_proj)\.(?:weight|bias))", r"head.\1")]


def convert_mixvpr(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """``resnet50_MixVPR_*.ckpt`` keys -> ``mixvpr_resnet50`` keys."""
    return rename(state, resnet_rules("backbone.model.", sequential=False) + MIXVPR_AGGREGATOR_RULES,
                  what="MixVPR (amaralibey/MixVPR)")


# descriptor size -> (tag, d, R, Google Drive file id, published R@1 Pitts250k/Pitts30k/MSLS-val)
_RELEASES = {
    4096: ("official", 1024, 4, "1vuz3PvnR7vxnDDLQrdHJaOA04SQrtk5L", (94.3, 91.6, 88.2)),
    512: ("official_512", 256, 2, "1khiTUNzZhfV2UUupZoIsPIbsMRBYVDqj", (93.2, 90.7, 84.1)),
    128: ("official_128", 64, 2, "1DQnefjk1hVICOEYPwE4-CZAZOvi1NSJz", (88.7, 87.8, 78.5)),
}

pretrained_cfgs = {
    f"mixvpr_resnet50.{tag}": PretrainedCfg(
        download_page=f"https://drive.google.com/file/d/{drive_id}/view",
        filename=f"resnet50_MixVPR_{dim}_channels({d})_rows({rows}).ckpt",
        remap=convert_mixvpr, model_kwargs={"out_channels": d, "out_rows": rows},
        input_size=(3, 320, 320), interpolation="bilinear", out_dim=dim,
        recipe="amaralibey/MixVPR main.py: GSV-Cities, 320x320, SGD, 80 epochs",
        license="no licence stated (amaralibey/MixVPR has no LICENSE file)",
        paper="MixVPR: Feature Mixing for Visual Place Recognition (Ali-bey et al., WACV 2023), arXiv:2303.02190",
        code="https://github.com/amaralibey/MixVPR",
        metrics={"pitts250k_test/R@1": p250, "pitts30k_test/R@1": p30, "msls_val/R@1": msls},
        notes="Inputs must be exactly 320x320.",
    )
    for dim, (tag, d, rows, drive_id, (p250, p30, msls)) in _RELEASES.items()
}


@register_model
def mixvpr_resnet50(**kwargs: Any) -> nn.Module:
    """MixVPR (L = 4 mixers over 20 x 20 positions, d = 1024, R = 4) on ResNet-50 layer3: 4096-D.
    Needs 320 x 320 inputs (the mixers are sized for 400 positions)."""
    return vpr(RESNET50_LAYER3, head(MixVPR), **kwargs)
