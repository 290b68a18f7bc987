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

Upstream facts of ``netvlad_vgg16`` (gmberton/VPR-methods-evaluation @ adbb6e2, MIT, ``vpr_models/netvlad.py``,
written after cvg/Hierarchical-Localization; method ``netvlad`` of its ``parser.py``: VGG16 only,
``--descriptors_dimension`` 4096 (default) or 32768):

- Weights: the authors' MatConvNet network ``VGG16-NetVLAD-Pitts30K`` as hloc republishes it,
  ``https://cvg-data.inf.ethz.ch/hloc/netvlad/Pitts30K_struct.mat`` (the suite also lists TokyoTM but uses
  Pitts30K). The suite parses the ``.mat`` (``scipy.io.loadmat``) into a torch module; this converter reads
  the ``.mat``'s layers (as :func:`aggzoo.hub.checkpoint.read_checkpoint` flattens them) or that module's
  state dict.
- ``backbone = Sequential(*list(vgg16().features.children())[:-2])``: conv1_1 ... conv5_3 without the last
  ReLU and max-pool -> ``backbone.<i>.{weight,bias}``, ``i`` as in ``vgg16().features``; the ``.mat``'s layer
  ``i`` holds ``{w [S, S, IN, OUT], b}`` at the same positions.
- ``netvlad = NetVLADLayer(512, 64, score_bias=False, intranorm=True)``: ``score_proj`` a Conv1d
  (``[64, 512, 1]``; the ``.mat``'s layer 30 weight 0, ``[512, 64]``), ``centers`` ``[512, 64]`` (D x K; layer 30
  weight 1 stores their negatives). The input is L2-normalised over channels first; residuals are summed into
  ``[B, 512, 64]``, intra-normalised over the 512 channels and flattened **channel-major** (index ``c * 64 + k``),
  then L2.
- 4096-D: ``whiten = Linear(32768, 4096)`` (the ``.mat``'s layer 33, a 1x1 conv ``[1, 1, 32768, 4096]`` with
  bias) on that L2-normalised vector, then L2. Our NetVLAD flattens K-major (index ``k * 512 + c``), so the
  converter permutes the whitening's input columns: the 4096-D descriptors are equal; the 32768-D ones are the
  suite's entries in another (fixed) order, which no inner-product or L2 search can tell apart.
- Preprocessing: RGB in 0..255 minus ``averageImage[0, 0]`` of the ``.mat``'s ``meta.normalization`` (the
  first pixel of the stored average image: one RGB triple), std 1. Its values were not readable here (the
  file is not stored); the cfg uses the MatConvNet VGG16 means that OpenIBL uses for the same network
  (123.68, 116.779, 103.939): to be confirmed against the file.
"""

from __future__ import annotations

import re
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


# MatConvNet layer indices the suite reads (vpr_models/netvlad.py): conv layers at the positions of
# vgg16().features (0..28), the NetVLAD layer (30: score weights D x K, negated centres D x K) and the
# whitening (33: a 1x1 conv [1, 1, C*K, D] and its bias).
_MAT_LAYERS = "net.layers."
_MAT_VLAD, _MAT_WHITEN = 30, 33


def _matconvnet_to_suite(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The ``.mat``'s layers (as :func:`aggzoo.hub.checkpoint.read_checkpoint` names them) -> the suite's
    module keys, with the suite's own reshapes: conv ``[S, S, IN, OUT] -> [OUT, IN, S, S]``, score
    ``[D, K] -> [K, D, 1]``, centres ``-[D, K]``, whitening ``[1, 1, IN, OUT] -> [OUT, IN]``."""
    rules = [
        (re.escape(f"{_MAT_LAYERS}{_MAT_VLAD}.weights.") + "0", "netvlad.score_proj.weight"),
        (re.escape(f"{_MAT_LAYERS}{_MAT_VLAD}.weights.") + "1", "netvlad.centers"),
        (re.escape(f"{_MAT_LAYERS}{_MAT_WHITEN}.weights.") + "0", "whiten.weight"),
        (re.escape(f"{_MAT_LAYERS}{_MAT_WHITEN}.weights.") + "1", "whiten.bias"),
        (re.escape(_MAT_LAYERS) + r"(\d|1\d|2[0-8])\.weights\.0", r"backbone.\1.weight"),
        (re.escape(_MAT_LAYERS) + r"(\d|1\d|2[0-8])\.weights\.1", r"backbone.\1.bias"),
        (r"net\..*", None),  # strides, paddings, the normalisation metadata, the layers after conv5_3
    ]
    out = rename(state, rules, what="NetVLAD VGG16 (MatConvNet .mat, as VPR-methods-evaluation reads it)")
    for key, value in out.items():
        value = value.float()
        if key.startswith("backbone.") and key.endswith(".weight"):
            value = value.permute(3, 2, 0, 1)
        elif key == "netvlad.score_proj.weight":
            value = value.T.unsqueeze(-1)
        elif key == "netvlad.centers":
            value = -value  # MatConvNet stores the negated centres
        elif key == "whiten.weight":
            value = value.reshape(value.shape[-2], value.shape[-1]).T
        elif key == "whiten.bias":
            value = value.reshape(-1)
        out[key] = value.contiguous()
    return out


def convert_netvlad_vgg16_suite(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """The released ``Pitts30K_struct.mat`` (``net.layers.<i>.weights.<j>``), or the state dict of
    VPR-methods-evaluation's ``NetVLAD`` module that parses it, -> ``netvlad_vgg16`` keys (module docstring).

    ``score_proj.weight [K, C, 1] -> conv.weight [K, C, 1, 1]``; ``centers [C, K] -> centroids [K, C]``;
    ``whiten.weight [D, C*K]`` (channel-major columns) -> K-major columns. A file with the whitening loads
    into the 32768-D model without it (the whitening is dropped)."""
    if any(key.startswith(_MAT_LAYERS) for key in state):
        state = _matconvnet_to_suite(state)
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
        url="https://cvg-data.inf.ethz.ch/hloc/netvlad/Pitts30K_struct.mat",
        filename="VGG16-NetVLAD-Pitts30K.mat",
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
        notes="The MatConvNet .mat is read as data (scipy.io.loadmat) and converted as the suite converts it; the "
              "state dict of the suite's NetVLAD module loads too. The input mean is the MatConvNet VGG mean "
              "(the .mat's averageImage is not checked against it). The suite evaluates at the images' own size "
              "(480x640 for its datasets). "
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
