"""BoQ on ResNet-50 (layer3) and DINOv2 ViT-B/14 (no final norm), with the authors' released weights."""

from __future__ import annotations

from typing import Any

from torch import nn

from aggzoo.convert.boq import convert_boq_dinov2, convert_boq_resnet50
from aggzoo.pretrained import PretrainedCfg
from aggzoo.registry import register_model, register_pretrained
from aggzoo.zoo._specs import DINOV2_EVAL_SIZE, DINOV2_VITB14_BLOCKS, RESNET50_LAYER3, head, vpr

__all__ = ["boq_dinov2_vitb14", "boq_resnet50"]

_PAPER = "BoQ: A Place is Worth a Bag of Learnable Queries (Ali-bey, Chaib-draa & Giguere, CVPR 2024), arXiv:2405.07364"
_CODE = "https://github.com/amaralibey/Bag-of-Queries"


@register_model
def boq_resnet50(**kwargs: Any) -> nn.Module:
    """BoQ (p = 512, Q = 64, L = 2, R = 32) on ResNet-50 cut after layer3: 16384-D."""
    spec = head("boq.BoQ", proj_channels=512, num_queries=64, num_layers=2, row_dim=32)
    return vpr(RESNET50_LAYER3, spec, **kwargs)


@register_model
def boq_dinov2_vitb14(**kwargs: Any) -> nn.Module:
    """BoQ (p = 384, Q = 64, L = 2, R = 32) on DINOv2 ViT-B/14 without its final norm: 12288-D."""
    spec = head("boq.BoQ", proj_channels=384, num_queries=64, num_layers=2, row_dim=32)
    return vpr(DINOV2_VITB14_BLOCKS, spec, **kwargs)


register_pretrained("boq_resnet50.official", PretrainedCfg(
    url="https://github.com/amaralibey/Bag-of-Queries/releases/download/v1.0/resnet50_16384.pth",
    remap=convert_boq_resnet50,
    input_size=(3, 384, 384), interpolation="bicubic", out_dim=16384,
    recipe="amaralibey/Bag-of-Queries: GSV-Cities at 320x320",
    license="MIT (amaralibey/Bag-of-Queries)", paper=_PAPER, code=_CODE,
    metrics={"pitts30k_test/R@1": 92.4, "pitts250k_test/R@1": 95.0, "msls_val/R@1": 91.2,
             "nordland_1frame/R@1": 70.7, "nordland_10frames/R@1": 83.1, "sped/R@1": 86.5},
    notes="Trained at 320x320; the README evaluates the ResNet-50 model at 384x384 (bicubic, antialiased).",
))

register_pretrained("boq_dinov2_vitb14.official", PretrainedCfg(
    url="https://github.com/amaralibey/Bag-of-Queries/releases/download/v1.0/dinov2_12288.pth",
    remap=convert_boq_dinov2,
    input_size=(3, DINOV2_EVAL_SIZE, DINOV2_EVAL_SIZE), interpolation="bicubic", out_dim=12288,
    recipe="amaralibey/Bag-of-Queries: GSV-Cities, 280x280, last 2 DINOv2 blocks trained",
    license="MIT (amaralibey/Bag-of-Queries)", paper=_PAPER, code=_CODE,
    metrics={"pitts30k_test/R@1": 93.7, "pitts250k_test/R@1": 96.6, "msls_val/R@1": 93.8,
             "msls_challenge/R@1": 79.0, "nordland_1frame/R@1": 81.3, "nordland_10frames/R@1": 90.6,
             "sped/R@1": 92.5},
    notes="The file's unused backbone.dino.norm.* (BoQ issue #20) are dropped by the converter.",
))
