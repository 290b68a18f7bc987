"""BoQ: a bag of learnable queries, on ResNet-50 (layer3) and DINOv2 ViT-B/14, with the authors' weights.

A. Ali-bey, B. Chaib-draa, P. Giguere, "BoQ: A Place is Worth a Bag of Learnable Queries", CVPR
2024, arXiv:2405.07364. Original code: amaralibey/Bag-of-Queries (MIT).

Upstream facts of the released checkpoints (release v1.0):

- ``hubconf.py``: ``VPRModel(backbone, aggregator)`` loads ``resnet50_16384.pth`` /
  ``dinov2_12288.pth`` (raw state dicts) with ``load_state_dict``.
- ResNet-50 (``backbones.py`` at the release commit 5ecf256, kept by 87ff48c "update ResNet code
  to match state_dict"): ``self.net = nn.Sequential(conv1, bn1, relu, maxpool, layer1, layer2,
  layer3)`` -> ``backbone.net.{0, 1, 4, 5, 6}.*`` (torchvision names inside).
- DINOv2: ``self.dino = torch.hub.load("facebookresearch/dinov2", "dinov2_vitb14")`` ->
  ``backbone.dino.<DINOv2 hub names>``. BoQ reads the blocks' output *without* the final norm, but
  the file still holds ``backbone.dino.norm.{weight, bias}`` (BoQ issue #20: strict loading failed
  after the norm was removed from the module); they are dropped here, on purpose.
- ``boq.py``: ``aggregator.{proj_c (Conv3x3), norm_input, boqs.{i}.{encoder (nn.TransformerEncoderLayer:
  self_attn.{in_proj_weight, in_proj_bias, out_proj}, linear1, linear2, norm1, norm2), queries
  [1, 64, p], self_attn, norm_q, cross_attn, norm_out}, fc (Linear(2*64 -> 32))}``; p = 512 (ResNet)
  or 384 (DINOv2).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from aggzoo.hub.cfg import PretrainedCfg
from aggzoo.hub.registry import register_model
from aggzoo.hub.remap import rename
from aggzoo.models.heads.boq import BoQ
from aggzoo.zoo._backbones import (
    DINOV2_EVAL_SIZE,
    DINOV2_VITB14_BLOCKS,
    RESNET50_LAYER3,
    adapt_dinov2_embeddings,
    dinov2_rules,
    head,
    resnet_rules,
    vpr,
)

__all__ = ["boq_dinov2_vitb14", "boq_resnet50", "convert_boq_dinov2", "convert_boq_resnet50"]

# Every aggregator tensor keeps its name under head.; strict loading then checks each one exists.
_AGGREGATOR_RULES = [(r"aggregator\.((?:proj_c|norm_input|fc|boqs\.\d+)\..+)", r"head.\1")]


def convert_boq_resnet50(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """``resnet50_16384.pth`` keys -> ``boq_resnet50`` keys."""
    return rename(state, resnet_rules("backbone.net.", sequential=True) + _AGGREGATOR_RULES,
                  what="BoQ ResNet-50 (amaralibey/Bag-of-Queries)")


def convert_boq_dinov2(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """``dinov2_12288.pth`` keys -> ``boq_dinov2_vitb14`` keys (unused final-norm keys dropped)."""
    out = rename(state, dinov2_rules("backbone.dino.", drop_norm=True) + _AGGREGATOR_RULES,
                 what="BoQ DINOv2 (amaralibey/Bag-of-Queries)")
    return adapt_dinov2_embeddings(out, model)


_PAPER = "BoQ: A Place is Worth a Bag of Learnable Queries (Ali-bey, Chaib-draa & Giguere, CVPR 2024), arXiv:2405.07364"
_CODE = "https://github.com/amaralibey/Bag-of-Queries"

pretrained_cfgs = {
    "boq_resnet50.official": PretrainedCfg(
        url="https://github.com/amaralibey/Bag-of-Queries/releases/download/v1.0/resnet50_16384.pth",
        remap=convert_boq_resnet50,
        input_size=(3, 384, 384), interpolation="bicubic", out_dim=16384,
        recipe="amaralibey/Bag-of-Queries: GSV-Cities at 320x320",
        license="MIT (amaralibey/Bag-of-Queries)", paper=_PAPER, code=_CODE,
        metrics={"pitts30k_test/R@1": 92.4, "pitts250k_test/R@1": 95.0, "msls_val/R@1": 91.2,
                 "nordland_1frame/R@1": 70.7, "nordland_10frames/R@1": 83.1, "sped/R@1": 86.5},
        notes="Trained at 320x320; the README evaluates the ResNet-50 model at 384x384 (bicubic, antialiased).",
    ),
    "boq_dinov2_vitb14.official": PretrainedCfg(
        url="https://github.com/amaralibey/Bag-of-Queries/releases/download/v1.0/dinov2_12288.pth",
        remap=convert_boq_dinov2,
        input_size=(3, DINOV2_EVAL_SIZE, DINOV2_EVAL_SIZE), interpolation="bicubic", out_dim=12288,
        recipe="amaralibey/Bag-of-Queries: GSV-Cities, 280x280, last 2 DINOv2 blocks trained",
        license="MIT (amaralibey/Bag-of-Queries)", paper=_PAPER, code=_CODE,
        metrics={"pitts30k_test/R@1": 93.7, "pitts250k_test/R@1": 96.6, "msls_val/R@1": 93.8,
                 "msls_challenge/R@1": 79.0, "nordland_1frame/R@1": 81.3, "nordland_10frames/R@1": 90.6,
                 "sped/R@1": 92.5},
        notes="The file's unused backbone.dino.norm.* (BoQ issue #20) are dropped by the converter.",
    ),
}


@register_model
def boq_resnet50(**kwargs: Any) -> nn.Module:
    """BoQ (p = 512, Q = 64, L = 2, R = 32) on ResNet-50 cut after layer3: 16384-D."""
    return vpr(RESNET50_LAYER3, head(BoQ), **kwargs)


@register_model
def boq_dinov2_vitb14(**kwargs: Any) -> nn.Module:
    """BoQ (p = 384, Q = 64, L = 2, R = 32) on DINOv2 ViT-B/14 without its final norm: 12288-D."""
    spec = head(BoQ, proj_channels=384)
    return vpr(DINOV2_VITB14_BLOCKS, spec, **kwargs)
