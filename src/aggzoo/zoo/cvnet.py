"""CVNet-Global: the global descriptor of CVNet's ResNets (GeM + FC on ResNet-50/101), with the authors' weights.

S. Lee, H. Seong, S. Lee, E. Kim, "Correlation Verification for Image Retrieval", CVPR 2022, arXiv:2204.01458.
Original code: sungonce/CVNet (MIT; its ResNet is pycls', via DELG-pytorch). SuperGlobal (Shao et al., ICCV 2023,
arXiv:2308.06954; ShihaoShao-GH/SuperGlobal, MIT) evaluates these same checkpoints with its own test-time
pooling and re-ranking: ``eval.py model=cvnet_resnet50.official preset=superglobal`` (conf/preset/superglobal.yaml).

Upstream facts of the released checkpoints (sungonce/CVNet @ 5f5bf24):

- ``core/checkpoint.py``: the file is ``{"model_state": <state dict of CVNet_Rerank>, ...}``, loaded completely.
- ``model/CVNet_Rerank_model.py``: ``CVNet_Rerank(depth, REDUCTION_DIM=2048)`` holds ``encoder_q`` (the global
  network, a ``ResNet``), and the re-ranking network ``conv2ds.{0,1,2}`` (3x3 convs on layer3, 1024 -> 256) and
  ``cv_learner.*`` (4D convolutions). Only ``encoder_q`` makes the global descriptor
  (``extract_global_descriptor``: ``normalize(encoder_q(x)[0])``): the re-ranking keys are dropped here.
- ``model/resnet.py``: pycls names -- ``stem.{conv,bn}``, ``s{1..4}.b{1..n}.f.{a,a_bn,b,b_bn,c,c_bn}`` (bottleneck,
  stride on the 3x3 as torchvision), ``s*.b1.{proj,bn}`` (shortcut) -- and ``head.pool.p`` (GeM, p learned, eps
  1e-6), ``head.fc`` (Linear 2048 -> 2048, bias). BatchNorm eps 1e-5 as timm's.
- ``test/dataset.py``: images are read with OpenCV (**BGR**) and normalised with the ImageNet mean/std in BGR
  order; the first convolution therefore expects BGR. The converter flips its input channels, so the model takes
  RGB with the ImageNet mean/std and computes the same function.
- ``test/test_model.py``, ``core/config.py``: images unresized (revisitop's, long side <= 1024; queries cropped to
  their box); scales ``TEST.SCALE_LIST = [0.7071, 1.0, 1.4142]`` (OpenCV INTER_AREA below 1, INTER_LINEAR above),
  the L2-normalised descriptors averaged and L2-normalised (``test/test_utils.py``); inner-product search.
  (The nearest protocol here: ``preset=revisited evaluation.test_time.scales=[0.7071,1.0,1.4142]
  evaluation.test_time.multiscale_interpolation=bilinear evaluation.protocol.multiple=1``; the cfg states the
  single-scale 1024 x 768 of a landscape revisitop image.)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from aggzoo.hub.cfg import PretrainedCfg
from aggzoo.hub.registry import register_model
from aggzoo.hub.remap import Rule, rename
from aggzoo.models.heads.gem_fc import GeMFC
from aggzoo.zoo._backbones import RESNET50_LAYER4, RESNET101_LAYER4, head, vpr

__all__ = ["convert_cvnet", "cvnet_resnet101", "cvnet_resnet50", "pycls_resnet_keys"]

_BLOCK = re.compile(r"s([1-4])\.b(\d+)\.")
_DST = "backbone.model."

#: pycls ResNet names (after :func:`pycls_resnet_keys`) -> timm ResNet names
_PYCLS_RULES: list[Rule] = [
    (r"stem\.conv\.(.+)", _DST + r"conv1.\1"),
    (r"stem\.bn\.(.+)", _DST + r"bn1.\1"),
    (r"layer([1-4])\.(\d+)\.f\.a\.(.+)", _DST + r"layer\1.\2.conv1.\3"),
    (r"layer([1-4])\.(\d+)\.f\.a_bn\.(.+)", _DST + r"layer\1.\2.bn1.\3"),
    (r"layer([1-4])\.(\d+)\.f\.b\.(.+)", _DST + r"layer\1.\2.conv2.\3"),
    (r"layer([1-4])\.(\d+)\.f\.b_bn\.(.+)", _DST + r"layer\1.\2.bn2.\3"),
    (r"layer([1-4])\.(\d+)\.f\.c\.(.+)", _DST + r"layer\1.\2.conv3.\3"),
    (r"layer([1-4])\.(\d+)\.f\.c_bn\.(.+)", _DST + r"layer\1.\2.bn3.\3"),
    (r"layer([1-4])\.(\d+)\.proj\.(.+)", _DST + r"layer\1.\2.downsample.0.\3"),
    (r"layer([1-4])\.(\d+)\.bn\.(.+)", _DST + r"layer\1.\2.downsample.1.\3"),
]


def pycls_resnet_keys(state: Mapping[str, Tensor], prefix: str) -> dict[str, Tensor]:
    """The keys under ``prefix`` without it, pycls' one-based ``s<i>.b<j>.`` renumbered as ``layer<i>.<j-1>.``
    (the other keys kept as they are)."""
    out = {}
    for key, tensor in state.items():
        if key.startswith(prefix):
            key = _BLOCK.sub(lambda m: f"layer{m.group(1)}.{int(m.group(2)) - 1}.", key[len(prefix):], count=1)
        out[key] = tensor
    return out


def convert_cvnet(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """``CVNet_Rerank`` checkpoint keys -> ``cvnet_resnet*`` keys: the global network ``encoder_q.*`` renamed, its
    first convolution's input channels flipped from BGR to RGB; the re-ranking network dropped."""
    rules = _PYCLS_RULES + [
        (r"head\.pool\.p", "head.pool.p"),
        (r"head\.fc\.(weight|bias)", r"head.fc.\1"),
        # CVNet-Rerank's correlation network (3x3 reductions of layer3 and the 4D-convolution learner): re-ranking only
        (r"(conv2ds|cv_learner)\..+", None),
    ]
    out = rename(pycls_resnet_keys(state, "encoder_q."), rules, what="CVNet (sungonce/CVNet)")
    stem = _DST + "conv1.weight"
    if stem in out:
        out[stem] = out[stem].flip(1)  # BGR -> RGB input channels
    return out


def _cvnet_cfg(depth: int) -> PretrainedCfg:
    return PretrainedCfg(
        download_page="https://drive.google.com/drive/folders/1gMbZ8JlTyPlH2-6HW5NHRe58LmKfJybx",
        filename=f"CVPR2022_CVNet_R{depth}.pyth",
        remap=convert_cvnet,
        input_size=(3, 768, 1024), interpolation="bilinear", out_dim=2048,
        recipe="sungonce/CVNet (CurricularFace + momentum contrastive loss on GLDv2-clean; training code not released)",
        license="MIT (sungonce/CVNet)",
        paper="Correlation Verification for Image Retrieval (Lee et al., CVPR 2022), arXiv:2204.01458",
        code="https://github.com/sungonce/CVNet",
        metrics={},
        notes=f"The global network of CVNet_Rerank R{depth} (the re-ranking network's keys are dropped). The authors "
              "evaluate unresized revisitop images at scales 0.7071, 1, 1.4142 (mean): preset=revisited "
              "evaluation.test_time.scales=[0.7071,1.0,1.4142] evaluation.test_time.multiscale_interpolation=bilinear "
              "evaluation.protocol.multiple=1; SuperGlobal's pipeline: preset=superglobal. "
              "Published mAP not recorded yet: the paper's tables could not be read here (no figure is typed from "
              "memory); the file name in the Drive folder is the one SuperGlobal's scripts expect, unpinned.",
    )


pretrained_cfgs = {f"cvnet_resnet{depth}.official": _cvnet_cfg(depth) for depth in (50, 101)}


@register_model
def cvnet_resnet50(**kwargs: Any) -> nn.Module:
    """CVNet-Global R50: GeM (learned p) + FC 2048 -> 2048 + L2 on ResNet-50 layer4: 2048-D."""
    return vpr(RESNET50_LAYER4, head(GeMFC), **kwargs)


@register_model
def cvnet_resnet101(**kwargs: Any) -> nn.Module:
    """CVNet-Global R101: GeM (learned p) + FC 2048 -> 2048 + L2 on ResNet-101 layer4: 2048-D."""
    return vpr(RESNET101_LAYER4, head(GeMFC), **kwargs)
