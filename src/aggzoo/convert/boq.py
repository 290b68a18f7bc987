"""BoQ official checkpoints (amaralibey/Bag-of-Queries release v1.0) -> ``boq_resnet50`` / ``boq_dinov2_vitb14``.

Upstream facts (amaralibey/Bag-of-Queries, MIT):

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

from torch import Tensor, nn

from aggzoo.convert.backbones import adapt_dinov2_embeddings, dinov2_rules, resnet_rules
from aggzoo.convert.common import rename

__all__ = ["convert_boq_dinov2", "convert_boq_resnet50"]

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
