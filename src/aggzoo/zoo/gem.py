"""GeM: generalized-mean pooling, on the project's backbones and with the dVGL benchmark's ResNet-50 conv4 weights.

F. Radenovic, G. Tolias, O. Chum, "Fine-tuning CNN Image Retrieval with No Human Annotation",
TPAMI 2018, arXiv:1711.02512. Original code: filipradenovic/cnnimageretrieval-pytorch (MIT). Weights
converted here: the deep-visual-geo-localization-benchmark (dVGL; Berton et al., CVPR 2022,
arXiv:2204.03444; MIT).

Upstream facts of the benchmark's GeM checkpoints (gmberton/deep-visual-geo-localization-benchmark):

- ``model/network.py``: ``--backbone resnet50conv4`` is ``nn.Sequential(*list(resnet.children())[:-3])``
  (cut after layer3, 1024 channels) -> ``backbone.{0, 1, 4, 5, 6}.*``; for ``--aggregation gem`` with
  the default ``--l2 before_pool`` (``parser.py``) the aggregation is ``nn.Sequential(L2Norm(), GeM(),
  Flatten())`` -> ``aggregation.1.p`` [1] (``model/aggregation.py``: p init 3, eps 1e-6). No L2 after the
  pooling: the descriptors are not unit-norm.
- ``test.py``: the search is ``faiss.IndexFlatL2`` (squared L2 distance), so the published figures are
  L2 rankings: these cfgs state ``eval_metric="l2"`` (``eval.py model=gem_resnet50conv4.official`` then
  searches by L2 distance; inner product would rank these descriptors otherwise).
- ``util.py`` ``resume_model``: a raw state dict or ``{"model_state_dict": ...}``, possibly with ``module.``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from aggzoo.hub.registry import register_model
from aggzoo.hub.remap import rename
from aggzoo.models.heads.gem import GeM
from aggzoo.zoo._backbones import EFFICIENTNET_LITE0, RESNET50_LAYER3, RESNET50_LAYER4, dvgl_releases, head, resnet_rules, vpr

__all__ = ["convert_gem_benchmark", "gem_efficientnet_lite0", "gem_resnet50", "gem_resnet50conv4"]


def convert_gem_benchmark(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """``resnet50conv4`` + GeM benchmark keys -> ``gem_resnet50conv4`` keys."""
    rules = resnet_rules("backbone.", sequential=True) + [(r"aggregation\.1\.p", "head.pool.p")]
    return rename(state, rules, what="GeM (deep-visual-geo-localization-benchmark)")


# tag -> (training set, Google Drive file id, published R@1 on Pitts30k-test / MSLS-val): the README's
# "Pretrained models with different backbones" table, row resnet50-gem.
_RELEASES = {
    "official": ("MSLS", "1uuIYJN4N7lQqqsN32pbZwjhz5Xvv3zr-", 77.4, 72.0),
    "official_pitts30k": ("Pitts30k", "1esgXzRFvDFHrMnwwR3GlTnErXjFNrYV7", 82.0, 38.0),
}

pretrained_cfgs = dvgl_releases(
    "gem_resnet50conv4", "gem", _RELEASES, remap=convert_gem_benchmark, out_dim=1024, eval_metric="l2",
    recipe_options=" (--l2 before_pool, the default)",
    notes="README model zoo row 'resnet50-gem'. Descriptors are not unit-norm (L2 before the pooling only); "
          "the benchmark ranks them by L2 distance (faiss.IndexFlatL2), and so does this cfg's protocol.")


@register_model
def gem_efficientnet_lite0(**kwargs: Any) -> nn.Module:
    """GeM (p = 3, learnable) on EfficientNet-Lite0 (stride 16): 112-D."""
    return vpr(EFFICIENTNET_LITE0, head(GeM), **kwargs)


@register_model
def gem_resnet50(**kwargs: Any) -> nn.Module:
    """GeM on ResNet-50 layer4 (Radenovic et al.): 2048-D."""
    return vpr(RESNET50_LAYER4, head(GeM), **kwargs)


@register_model
def gem_resnet50conv4(**kwargs: Any) -> nn.Module:
    """GeM on ResNet-50 conv4 (layer3) as the dVGL benchmark trains it: L2 over channels, GeM, no final L2; 1024-D."""
    return vpr(RESNET50_LAYER3, head(GeM, l2="before_pool"), **kwargs)
