"""NetVLAD, on the project's EfficientNet-Lite0, on ResNet-50 conv4 with the benchmark's weights, and on
VGG16 with the authors' Pitts30k weights as gmberton/VPR-methods-evaluation loads them.

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

from aggzoo.errors import ConversionError
from aggzoo.hub.cfg import PretrainedCfg
from aggzoo.hub.registry import register_model
from aggzoo.hub.remap import rename
from aggzoo.models.heads.netvlad import NetVLAD
from aggzoo.zoo._backbones import (
    EFFICIENTNET_LITE0,
    RESNET50_LAYER3,
    VGG16_CONV5,
    dvgl_releases,
    head,
    resnet_rules,
    vgg_rules,
    vpr,
)

__all__ = ["MATCONVNET_VGG_MEAN", "convert_netvlad_benchmark", "convert_netvlad_vgg16_suite", "netvlad_efficientnet_lite0",
           "netvlad_resnet50", "netvlad_vgg16"]

#: the MatConvNet VGG16 input mean on 0..1 RGB, with std 1/255 (inputs in 0..255 minus 123.68, 116.779,
#: 103.939), as yxgeee/OpenIBL's README normalises for its VGG16 NetVLAD models
MATCONVNET_VGG_MEAN = (0.48501960784313836, 0.4579568627450961, 0.4076039215686255)
MATCONVNET_VGG_STD = (1 / 255, 1 / 255, 1 / 255)


def convert_netvlad_benchmark(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """``resnet50conv4`` + NetVLAD benchmark keys -> ``netvlad_resnet50`` keys."""
    rules = resnet_rules("backbone.", sequential=True) + [(r"aggregation\.(conv\.weight|centroids)", r"head.\1")]
    return rename(state, rules, what="NetVLAD (deep-visual-geo-localization-benchmark)")


def convert_netvlad_vgg16_suite(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """VPR-methods-evaluation ``NetVLAD`` module keys -> ``netvlad_vgg16`` keys (see the module docstring).

    ``score_proj.weight [K, C, 1] -> conv.weight [K, C, 1, 1]``; ``centers [C, K] -> centroids [K, C]``;
    ``whiten.weight [D, C*K]`` (channel-major columns) -> K-major columns. A file with the whitening loads
    into the 32768-D model without it (the whitening is dropped)."""
    whitened = getattr(model.get_submodule("head"), "whiten", None) is not None
    rules = vgg_rules("backbone.") + [
        (r"netvlad\.score_proj\.weight", "head.conv.weight"),
        (r"netvlad\.centers", "head.centroids"),
        (r"whiten\.(weight|bias)", r"head.whiten.\1" if whitened else None),
    ]
    out = rename(state, rules, what="NetVLAD VGG16 (gmberton/VPR-methods-evaluation vpr_models/netvlad.py)")
    if "head.conv.weight" not in out or "head.centroids" not in out:
        raise ConversionError("NetVLAD VGG16: the checkpoint has no netvlad.score_proj.weight / netvlad.centers")
    out["head.conv.weight"] = out["head.conv.weight"].unsqueeze(-1)
    centers = out["head.centroids"]
    out["head.centroids"] = centers.T.contiguous()
    if "head.whiten.weight" in out:
        channels, clusters = centers.shape
        weight = out["head.whiten.weight"]
        out["head.whiten.weight"] = (weight.reshape(weight.shape[0], channels, clusters).transpose(1, 2)
                                     .reshape(weight.shape[0], channels * clusters).contiguous())
    return out


# tag -> (training set, Google Drive file id, published R@1 on Pitts30k-test / MSLS-val)
_RELEASES = {
    "official": ("MSLS", "1krf0A6CeW8GqLqHWZ7dlSNJ9aTJ4dotF", 80.9, 76.9),
    "official_pitts30k": ("Pitts30k", "1KL8HoAApOjJFETin7Q7u7IcsOvroKlSj", 86.0, 50.7),
}

pretrained_cfgs = dvgl_releases(
    "netvlad_resnet50", "netvlad", _RELEASES, remap=convert_netvlad_benchmark, out_dim=65536,
    notes="README model zoo row 'resnet50-netvlad'; resnet50conv4 is the benchmark's ResNet cut for NetVLAD.")


def _vgg16_pitts30k(dim: int) -> PretrainedCfg:
    return PretrainedCfg(
        download_page="https://cvg-data.inf.ethz.ch/hloc/netvlad/Pitts30K_struct.mat",
        filename="VGG16-NetVLAD-Pitts30K_suite.pth",
        remap=convert_netvlad_vgg16_suite,
        model_kwargs={} if dim == 4096 else {"whiten_dim": None},
        input_size=(3, 480, 640), interpolation="bilinear", out_dim=dim,
        mean=MATCONVNET_VGG_MEAN, std=MATCONVNET_VGG_STD,
        recipe="Relja/netvlad (MatConvNet) vd16_pitts30k_conv5_3_vlad_preL2_intra_white, loaded by "
               f"gmberton/VPR-methods-evaluation --method netvlad --descriptors_dimension {dim}",
        license="MIT (Relja/netvlad; gmberton/VPR-methods-evaluation)",
        paper="NetVLAD: CNN architecture for weakly supervised place recognition (Arandjelovic et al., CVPR 2016), "
              "arXiv:1511.07247",
        code="https://github.com/gmberton/VPR-methods-evaluation",
        notes="The file is MatConvNet's .mat, which aggzoo does not parse: the converter reads the state dict of "
              "VPR-methods-evaluation's NetVLAD module (torch.save(model.state_dict()) after it loads the .mat). "
              "The suite evaluates at the images' own size (480x640 for its datasets). "
              + ("4096-D: PCA-whitening + L2 on the 32768-D vector." if dim == 4096 else
                 "32768-D: the suite's descriptor entries in K-major order (the same distances)."),
    )


pretrained_cfgs |= {
    "netvlad_vgg16.pitts30k": _vgg16_pitts30k(4096),
    "netvlad_vgg16.pitts30k_32768": _vgg16_pitts30k(32768),
}


@register_model
def netvlad_efficientnet_lite0(**kwargs: Any) -> nn.Module:
    """NetVLAD (K = 64) on EfficientNet-Lite0 (stride 16): 64 x 112 = 7168-D."""
    return vpr(EFFICIENTNET_LITE0, head(NetVLAD), **kwargs)


@register_model
def netvlad_resnet50(**kwargs: Any) -> nn.Module:
    """NetVLAD (K = 64) on ResNet-50 conv4 (layer3, 1024 channels): 65536-D."""
    return vpr(RESNET50_LAYER3, head(NetVLAD), **kwargs)


@register_model
def netvlad_vgg16(**kwargs: Any) -> nn.Module:
    """NetVLAD (K = 64) on VGG16 conv5_3 before ReLU, PCA-whitened to 4096-D (``whiten_dim=None``: 32768-D)."""
    return vpr(VGG16_CONV5, head(NetVLAD, whiten_dim=4096), **kwargs)
