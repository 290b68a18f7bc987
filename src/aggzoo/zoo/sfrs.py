"""SFRS: NetVLAD on VGG16 trained with self-supervised fine-grained region similarities, with the authors' weights.

Y. Ge, H. Wang, F. Zhu, R. Zhao, H. Li, "Self-supervising Fine-grained Region Similarities for
Large-scale Image Localization", ECCV 2020, arXiv:2006.03926. Original code: yxgeee/OpenIBL (MIT).
SFRS changes the training (soft labels from region similarities), not the network: the model is
NetVLAD on VGG16 with a PCA-whitening, so this method has a zoo file and no head of its own
(:class:`~aggzoo.models.heads.netvlad.NetVLAD` with ``whiten_dim=4096``). gmberton/VPR-methods-evaluation
(``vpr_models/sfrs.py``, method ``sfrs``: VGG16, 4096-D only) loads the same release through torch.hub.

Upstream facts (yxgeee/OpenIBL @ f3ef4fb):

- ``hubconf.py`` ``vgg16_netvlad(pretrained=True)``: ``EmbedNetPCA(vgg16(pretrained=False), NetVLAD(dim=512))``
  loaded strictly from ``https://github.com/yxgeee/OpenIBL/releases/download/v0.1.0-beta/vgg16_netvlad.pth``
  (a raw state dict).
- ``ibl/models/vgg.py``: ``base = Sequential(*list(vgg16().features.children())[:-2])``: conv5_3 before its
  ReLU and the last max-pool -> ``base_model.base.<i>.{weight,bias}``; conv1-conv4 frozen (``train_layers="conv5"``).
- ``ibl/models/netvlad.py`` ``NetVLAD(num_clusters=64, dim=512, normalize_input=True)``: input L2 over
  channels, ``conv`` 1x1 without bias (``net_vlad.conv.weight [64, 512, 1, 1]``), ``centroids [64, 512]``,
  residuals summed into ``[B, 64, 512]``; ``EmbedNetPCA.forward``: intra-L2 over the 512 channels, flatten
  K-major, L2, then ``pca_layer = Conv2d(32768, 4096, 1)`` with bias on the ``[B, 32768, 1, 1]`` vector (the
  PCA-whitening, applied after the normalisations), then a final L2 -> 4096-D.
- Preprocessing (README quick start; ``vpr_models/sfrs.py``): resize to 480x640, ``ToTensor``, mean
  ``(0.48502, 0.45796, 0.40760)`` and std ``1/255``: RGB in 0..255 minus the MatConvNet VGG mean.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from aggzoo.hub.cfg import PretrainedCfg
from aggzoo.hub.registry import register_model
from aggzoo.hub.remap import rename
from aggzoo.models.heads.netvlad import NetVLAD
from aggzoo.zoo._backbones import VGG16_CONV5, head, vgg_rules, vpr
from aggzoo.zoo.netvlad import MATCONVNET_VGG_MEAN, MATCONVNET_VGG_STD

__all__ = ["convert_openibl", "sfrs_vgg16"]


def convert_openibl(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """OpenIBL ``EmbedNetPCA`` keys -> ``sfrs_vgg16`` keys; the 1x1-conv whitening becomes a Linear weight."""
    rules = vgg_rules("base_model.base.") + [
        (r"net_vlad\.(conv\.weight|centroids)", r"head.\1"),
        (r"pca_layer\.(weight|bias)", r"head.whiten.\1"),
    ]
    out = rename(state, rules, what="SFRS / NetVLAD (yxgeee/OpenIBL EmbedNetPCA)")
    if "head.whiten.weight" in out:
        out["head.whiten.weight"] = out["head.whiten.weight"].flatten(1)
    return out


pretrained_cfgs = {
    "sfrs_vgg16.official": PretrainedCfg(
        url="https://github.com/yxgeee/OpenIBL/releases/download/v0.1.0-beta/vgg16_netvlad.pth",
        remap=convert_openibl,
        input_size=(3, 480, 640), interpolation="bilinear", out_dim=4096,
        mean=MATCONVNET_VGG_MEAN, std=MATCONVNET_VGG_STD,
        recipe="yxgeee/OpenIBL docs/REPRODUCTION.md: SFRS on Pitts30k-train (VGG16 + NetVLAD, PCA-whitening to 4096)",
        license="MIT (yxgeee/OpenIBL)",
        paper="Self-supervising Fine-grained Region Similarities for Large-scale Image Localization "
              "(Ge et al., ECCV 2020), arXiv:2006.03926",
        code="https://github.com/yxgeee/OpenIBL",
        metrics={"pitts250k_test/R@1": 90.7, "tokyo247/R@1": 85.4},
        notes="Figures: yxgeee/OpenIBL docs/MODEL_ZOO.md, rows SFRS (trained on Pitts30k-train; R@5 / R@10: "
              "Pitts250k-test 96.4 / 97.6, Tokyo 24/7 91.1 / 93.3). "
              "OpenIBL resizes to 480x640; VPR-methods-evaluation uses the images' own size.",
    ),
}


@register_model
def sfrs_vgg16(**kwargs: Any) -> nn.Module:
    """SFRS: NetVLAD (K = 64) on VGG16 conv5_3 before ReLU, PCA-whitened to 4096-D."""
    return vpr(VGG16_CONV5, head(NetVLAD, whiten_dim=4096), **kwargs)
