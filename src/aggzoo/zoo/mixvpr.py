"""MixVPR on ResNet-50 (layer3, 320 x 320 inputs), with the authors' released weights (4096/512/128-D)."""

from __future__ import annotations

from typing import Any

from torch import nn

from aggzoo.convert.mixvpr import convert_mixvpr
from aggzoo.pretrained import PretrainedCfg
from aggzoo.registry import register_model, register_pretrained
from aggzoo.zoo._specs import RESNET50_LAYER3, head, vpr

__all__ = ["mixvpr_resnet50"]


@register_model
def mixvpr_resnet50(**kwargs: Any) -> nn.Module:
    """MixVPR (L = 4 mixers over 20 x 20 positions, d = 1024, R = 4) on ResNet-50 layer3: 4096-D.
    Needs 320 x 320 inputs (the mixers are sized for 400 positions)."""
    spec = head("mixvpr.MixVPR", in_h=20, in_w=20, out_channels=1024, mix_depth=4, mlp_ratio=1.0, out_rows=4)
    return vpr(RESNET50_LAYER3, spec, **kwargs)


# descriptor size -> (tag, d, R, Google Drive file id, published R@1 Pitts250k/Pitts30k/MSLS-val)
_RELEASES = {
    4096: ("official", 1024, 4, "1vuz3PvnR7vxnDDLQrdHJaOA04SQrtk5L", (94.3, 91.6, 88.2)),
    512: ("official_512", 256, 2, "1khiTUNzZhfV2UUupZoIsPIbsMRBYVDqj", (93.2, 90.7, 84.1)),
    128: ("official_128", 64, 2, "1DQnefjk1hVICOEYPwE4-CZAZOvi1NSJz", (88.7, 87.8, 78.5)),
}

for _dim, (_tag, _d, _rows, _drive_id, (_p250, _p30, _msls)) in _RELEASES.items():
    register_pretrained(f"mixvpr_resnet50.{_tag}", PretrainedCfg(
        download_page=f"https://drive.google.com/file/d/{_drive_id}/view",
        filename=f"resnet50_MixVPR_{_dim}_channels({_d})_rows({_rows}).ckpt",
        remap=convert_mixvpr, model_kwargs={"out_channels": _d, "out_rows": _rows},
        input_size=(3, 320, 320), interpolation="bilinear", out_dim=_dim,
        recipe="amaralibey/MixVPR main.py: GSV-Cities, 320x320, SGD, 80 epochs",
        license="no licence stated (amaralibey/MixVPR has no LICENSE file)",
        paper="MixVPR: Feature Mixing for Visual Place Recognition (Ali-bey et al., WACV 2023), arXiv:2303.02190",
        code="https://github.com/amaralibey/MixVPR",
        metrics={"pitts250k_test/R@1": _p250, "pitts30k_test/R@1": _p30, "msls_val/R@1": _msls},
        notes="Inputs must be exactly 320x320.",
    ))
