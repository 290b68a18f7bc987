"""NetVLAD checkpoints of the deep-visual-geo-localization-benchmark -> ``netvlad_resnet50``.

Upstream facts (gmberton/deep-visual-geo-localization-benchmark, MIT):

- ``model/network.py``: for ``--backbone resnet50conv4`` the backbone is
  ``nn.Sequential(*list(resnet.children())[:-3])`` (cut after layer3, 1024 channels) ->
  ``backbone.{0 conv1, 1 bn1, 4 layer1, 5 layer2, 6 layer3}.*``; for ``--aggregation netvlad`` the
  aggregation is the NetVLAD module itself (not wrapped) -> ``aggregation.conv.weight`` [64, 1024,
  1, 1] (no bias) and ``aggregation.centroids`` [64, 1024].
- ``util.py`` ``resume_model``: files are either the raw state dict (the README's model zoo) or
  ``{"model_state_dict": ...}`` (training checkpoints), possibly with ``module.`` prefixes; both
  are unwrapped before this function runs.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor, nn

from aggzoo.convert.backbones import resnet_rules
from aggzoo.convert.common import rename

__all__ = ["convert_netvlad_benchmark"]


def convert_netvlad_benchmark(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """``resnet50conv4`` + NetVLAD benchmark keys -> ``netvlad_resnet50`` keys."""
    rules = resnet_rules("backbone.", sequential=True) + [(r"aggregation\.(conv\.weight|centroids)", r"head.\1")]
    return rename(state, rules, what="NetVLAD (deep-visual-geo-localization-benchmark)")
