"""NetVLAD, on the project's EfficientNet-Lite0 and on ResNet-50 conv4 with the benchmark's weights.

R. Arandjelovic, P. Gronat, A. Torii, T. Pajdla, J. Sivic, "NetVLAD: CNN architecture for weakly
supervised place recognition", CVPR 2016, arXiv:1511.07247. Weights converted here: the
deep-visual-geo-localization-benchmark (Berton et al., CVPR 2022, arXiv:2204.03444; MIT).

Upstream facts of the benchmark's checkpoints (gmberton/deep-visual-geo-localization-benchmark):

- ``model/network.py``: for ``--backbone resnet50conv4`` the backbone is
  ``nn.Sequential(*list(resnet.children())[:-3])`` (cut after layer3, 1024 channels) ->
  ``backbone.{0 conv1, 1 bn1, 4 layer1, 5 layer2, 6 layer3}.*``; for ``--aggregation netvlad`` the
  aggregation is the NetVLAD module itself (not wrapped) -> ``aggregation.conv.weight`` [64, 1024,
  1, 1] (no bias) and ``aggregation.centroids`` [64, 1024].
- ``util.py`` ``resume_model``: files are either the raw state dict (the README's model zoo) or
  ``{"model_state_dict": ...}`` (training checkpoints), possibly with ``module.`` prefixes; both
  are unwrapped before the converter runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from aggzoo.hub.registry import register_model
from aggzoo.hub.remap import rename
from aggzoo.models.heads.netvlad import NetVLAD
from aggzoo.zoo._backbones import EFFICIENTNET_LITE0, RESNET50_LAYER3, dvgl_releases, head, resnet_rules, vpr

__all__ = ["convert_netvlad_benchmark", "netvlad_efficientnet_lite0", "netvlad_resnet50"]


def convert_netvlad_benchmark(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """``resnet50conv4`` + NetVLAD benchmark keys -> ``netvlad_resnet50`` keys."""
    rules = resnet_rules("backbone.", sequential=True) + [(r"aggregation\.(conv\.weight|centroids)", r"head.\1")]
    return rename(state, rules, what="NetVLAD (deep-visual-geo-localization-benchmark)")


# tag -> (training set, Google Drive file id, published R@1 on Pitts30k-test / MSLS-val)
_RELEASES = {
    "official": ("MSLS", "1krf0A6CeW8GqLqHWZ7dlSNJ9aTJ4dotF", 80.9, 76.9),
    "official_pitts30k": ("Pitts30k", "1KL8HoAApOjJFETin7Q7u7IcsOvroKlSj", 86.0, 50.7),
}

pretrained_cfgs = dvgl_releases(
    "netvlad_resnet50", "netvlad", _RELEASES, remap=convert_netvlad_benchmark, out_dim=65536,
    notes="README model zoo row 'resnet50-netvlad'; resnet50conv4 is the benchmark's ResNet cut for NetVLAD.")


@register_model
def netvlad_efficientnet_lite0(**kwargs: Any) -> nn.Module:
    """NetVLAD (K = 64) on EfficientNet-Lite0 (stride 16): 64 x 112 = 7168-D."""
    return vpr(EFFICIENTNET_LITE0, head(NetVLAD), **kwargs)


@register_model
def netvlad_resnet50(**kwargs: Any) -> nn.Module:
    """NetVLAD (K = 64) on ResNet-50 conv4 (layer3, 1024 channels): 65536-D."""
    return vpr(RESNET50_LAYER3, head(NetVLAD), **kwargs)
