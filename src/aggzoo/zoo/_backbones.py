"""The backbones the zoo's entries share: each one's spec and the key rules of its official checkpoints.

A spec is ``{"_target_": <class of aggzoo.models>, <constructor keyword arguments>}`` -- the same
shape as a Hydra ``conf/backbone`` / ``conf/head`` file -- so a registered model and a trained
pipeline run describe their architecture the same way, and :func:`aggzoo.hub.builder.build_model`
(the one builder) turns either into a model.

Key rules, shared by the converters of the method files (torchvision ResNet and DINOv2 -> timm):

torchvision ResNet -> timm ``resnet*``: timm kept torchvision's module names (``conv1``, ``bn1``,
``layer{1..4}.{i}.{conv,bn}{1,2,3}``, ``downsample.{0,1}``), so only the upstream wrapper changes:
a named attribute (``backbone.model.layer3...``) or ``nn.Sequential(*children)`` indices
(``backbone.net.6...``: 0 conv1, 1 bn1, 2 relu, 3 maxpool, 4..7 layer1..layer4).

DINOv2 (facebookresearch/dinov2 ``vision_transformer.py``, torch.hub models) -> timm
``vit_*_patch14[_reg4]_dinov2``: blocks, attention (fused ``qkv``), layer scale (``ls1.gamma``,
``ls2.gamma``) and the final ``norm`` have the same names. Differences handled here:

- ``mask_token`` (masked image modelling, unused at inference) has no timm counterpart: dropped.
- ``register_tokens`` [1, R, C] -> ``reg_token``. timm builds the register models with
  ``no_embed_class=True``: its ``pos_embed`` covers only the patches and its class token carries
  its own position, so ``cls_token <- cls_token + pos_embed[:, :1]`` and
  ``pos_embed <- pos_embed[:, 1:]`` (DINOv2 adds the position before inserting the registers, so the
  two compute the same tokens).
- Block-chunked checkpoints (``blocks.<chunk>.<i>.*``, FSDP training) are flattened.
- ``pos_embed`` is stored for a 37 x 37 grid (518 px) and is kept at that grid: the zoo's DINOv2
  backbones are built with ``pos_embed_resample="dinov2"``, so they resample it once per input size
  exactly as DINOv2 does at run time (bicubic, ``scale_factor = (g + 0.1) / 37`` per axis, the
  historical offset, no antialiasing; :mod:`aggzoo.layers.pos_embed`), and the converted model equals
  the upstream one at every input size, not only at the 322 x 322 it is built for. (Before issue 12
  the converter resampled the grid to 23 x 23 here and timm resampled that a second time at other
  sizes: up to 2e-2 off at 224 x 224.) Files written since then hold the 37 x 37 grid under the same
  key; files written before hold the 23 x 23 one and still load (the backbone keeps the grid it is
  given: identical at 322, DINOv2's rule from 23 x 23 elsewhere). A backbone built with timm's rule
  (``pos_embed_resample="timm"``) still gets the grid resampled to its size here, as before.
  Note: DINOv2's torch.hub *register* models (``dinov2_vitb14_reg``) are built with offset 0.0 and
  antialiasing on; every checkpoint converted here (SALAD, MegaLoc, BoQ, ImAge, EDTformer) uses the defaults.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from aggzoo.errors import ConversionError
from aggzoo.hub.builder import build_model, class_path
from aggzoo.hub.cfg import PretrainedCfg, RemapFn
from aggzoo.hub.remap import Rule
from aggzoo.layers.pos_embed import DINOV2_INTERPOLATE_OFFSET, resample_grid_dinov2
from aggzoo.models.backbones.aggregation_tokens import AggregationTokenViT
from aggzoo.models.backbones.lopa import LoPAViT
from aggzoo.models.backbones.timm_backbone import TimmBackbone
from aggzoo.models.backbones.vgg import PreActivationVGG
from aggzoo.models.heads.base import Head

__all__ = [
    "DINOV2_EVAL_SIZE",
    "DINOV2_INTERPOLATE_OFFSET",
    "DINOV2_VITB14",
    "DINOV2_VITB14_BLOCKS",
    "DINOV2_VITB14_LOPA",
    "DINOV2_VITB14_REG4_TOKENS",
    "EFFICIENTNET_LITE0",
    "EFFICIENTNET_LITE0_MULTILEVEL",
    "RESNET50_LAYER3",
    "RESNET50_LAYER4",
    "RESNET101_LAYER4",
    "VGG16_CONV5",
    "adapt_dinov2_embeddings",
    "dinov2_rules",
    "resample_dinov2_pos_embed",
    "head",
    "resnet_rules",
    "vgg_rules",
    "vpr",
]

# torchvision ResNet.children() order; None marks the parameter-free ReLU and max-pool.
_RESNET_CHILDREN: tuple[str | None, ...] = ("conv1", "bn1", None, None, "layer1", "layer2", "layer3", "layer4")
_TIMM_BACKBONE = "backbone.model."


# -- specs -----------------------------------------------------------------------------------------


def backbone(model_name: str, *, cls: type[TimmBackbone] = TimmBackbone, **kwargs: Any) -> dict[str, Any]:
    """The spec of ``cls(model_name, **kwargs)``."""
    return {"_target_": class_path(cls), "model_name": model_name, **kwargs}


def head(cls: type[Head], **kwargs: Any) -> dict[str, Any]:
    """``head(GeM, p=3.0)`` -> ``{"_target_": "aggzoo.models.heads.gem.GeM", "p": 3.0}``: the
    arguments that differ from the class defaults (which are the paper's)."""
    return {"_target_": class_path(cls), **kwargs}


#: DINOv2 models are built for 322 x 322 inputs (23 x 23 patches), the evaluation size of SALAD,
#: BoQ, ImAge and EDTformer; other sizes work (dynamic_img_size). Official checkpoints keep their
#: 37 x 37 position grid, resampled per input size the way DINOv2 does (``pos_embed_resample``).
DINOV2_EVAL_SIZE = 322

# ImageNet EfficientNet-Lite0 (offline weights) cut at stride 16 (blocks.4, 112 channels): the
# project's default backbone, as conf/backbone/tf_efficientnet_lite0.yaml.
EFFICIENTNET_LITE0 = backbone("tf_efficientnet_lite0", out_indices=[-2], frozen_stages=2)
# The same, returning blocks.1/2/4 (24/40/112 channels) for multi-level heads.
EFFICIENTNET_LITE0_MULTILEVEL = backbone("tf_efficientnet_lite0", out_indices=[1, 2, 3], frozen_stages=2)
# ResNets cut after layer3 (1024 channels, MixVPR/BoQ) or layer4 (2048, ConvAP/CosPlace/NetVLAD
# conv5); stem, layer1 and layer2 frozen as in the upstream recipes.
RESNET50_LAYER3 = backbone("resnet50", out_indices=[3], frozen_stages=3)
RESNET50_LAYER4 = backbone("resnet50", out_indices=[4], frozen_stages=3)
RESNET101_LAYER4 = backbone("resnet101", out_indices=[4], frozen_stages=3)
# VGG16 cropped at conv5_3 before its ReLU (NetVLAD's crop: 512 channels, stride 16); conv1-conv4
# frozen, conv5 trained, as NetVLAD and OpenIBL's SFRS (train_layers="conv5").
VGG16_CONV5 = backbone("vgg16", cls=PreActivationVGG, out_indices=[4], frozen_stages=4)
# DINOv2 ViT-B/14, final norm applied, last 4 blocks trainable (SALAD, MegaLoc, EDTformer).
DINOV2_VITB14 = backbone(
    "vit_base_patch14_dinov2", img_size=DINOV2_EVAL_SIZE, dynamic_img_size=True, frozen_stages=8, final_norm=True,
    pos_embed_resample="dinov2",
)
# DINOv2 ViT-B/14 without the final norm, last 2 blocks trainable (BoQ reads the raw block output).
DINOV2_VITB14_BLOCKS = dict(DINOV2_VITB14, frozen_stages=10, final_norm=False)
# DINOv2 ViT-B/14, frozen, with EDTformer's parallel low-rank adapters (r = 4) beside its blocks.
DINOV2_VITB14_LOPA = backbone(
    "vit_base_patch14_dinov2", cls=LoPAViT, adapter_dim=4, adapter_scale=0.5, frozen_stages=None,
    img_size=DINOV2_EVAL_SIZE, dynamic_img_size=True, pos_embed_resample="dinov2",
)
# DINOv2 ViT-B/14 with 4 registers and 8 aggregation tokens before block 8 (ImAge).
DINOV2_VITB14_REG4_TOKENS = backbone(
    "vit_base_patch14_reg4_dinov2", cls=AggregationTokenViT, num_tokens=8, insert_before_block=8,
    img_size=DINOV2_EVAL_SIZE, dynamic_img_size=True, pos_embed_resample="dinov2",
)


def vpr(
    backbone_spec: Mapping[str, Any],
    head_spec: Mapping[str, Any],
    *,
    pretrained_backbone: bool = False,
    backbone_kwargs: Mapping[str, Any] | None = None,
    **head_kwargs: Any,
) -> nn.Module:
    """``VPRModel(backbone, head)`` from two specs, through the one builder.

    Args:
        pretrained_backbone: load the backbone's own pretrained weights (ImageNet / DINOv2).
        backbone_kwargs: overrides of the backbone spec (``img_size``, ``frozen_stages``, ...).
        **head_kwargs: overrides of the head's keyword arguments.
    """
    spec = {
        "backbone": {**backbone_spec, **(backbone_kwargs or {}), "pretrained": bool(pretrained_backbone)},
        "head": {**head_spec, **head_kwargs},
    }
    return build_model(spec)


# -- key rules of official checkpoints -------------------------------------------------------------


def vgg_rules(src: str, *, dst: str = _TIMM_BACKBONE) -> list[Rule]:
    """Rules renaming torchvision ``vgg.features`` children stored under ``src`` (``"base_model.base."``,
    ``"backbone."``) to a timm VGG under ``dst``: both number the layers as ``features`` does."""
    return [(re.escape(src) + r"(\d+)\.(weight|bias)", dst + r"features.\1.\2")]


#: the published releases of gmberton/deep-visual-geo-localization-benchmark (MIT): ResNet-50 cut after
#: layer3 ("resnet50conv4"), evaluated at 480x640 bilinear
DVGL_CODE = "https://github.com/gmberton/deep-visual-geo-localization-benchmark"


def dvgl_releases(arch: str, aggregation: str, releases: Mapping[str, tuple[str, str, float, float]], *,
                  remap: RemapFn, out_dim: int, notes: str, recipe_options: str = "",
                  **fields: Any) -> dict[str, PretrainedCfg]:
    """``{"<arch>.<tag>": PretrainedCfg}`` of the benchmark's ``resnet50conv4 + <aggregation>`` weights.

    ``releases``: tag -> (training set, Google Drive file id, published R@1 on Pitts30k-test / MSLS-val),
    the benchmark README's model-zoo rows; ``recipe_options``: what its train.py ran besides the
    backbone and aggregation; ``fields``: further PretrainedCfg fields (e.g. ``eval_metric``)."""
    return {
        f"{arch}.{tag}": PretrainedCfg(
            download_page=f"https://drive.google.com/file/d/{drive_id}/view",
            filename=f"resnet50conv4_{aggregation}_{data.lower()}.pth",
            remap=remap,
            input_size=(3, 480, 640), interpolation="bilinear", out_dim=out_dim,
            recipe=f"gmberton/deep-visual-geo-localization-benchmark train.py --backbone=resnet50conv4 "
                   f"--aggregation={aggregation}{recipe_options} on {data}",
            license="MIT (gmberton/deep-visual-geo-localization-benchmark)",
            paper="Deep Visual Geo-localization Benchmark (Berton et al., CVPR 2022), arXiv:2204.03444",
            code=DVGL_CODE,
            metrics={"pitts30k_test/R@1": pitts, "msls_val/R@1": msls},
            notes=notes,
            **fields,
        )
        for tag, (data, drive_id, pitts, msls) in releases.items()
    }


def resnet_rules(src: str, *, sequential: bool, dst: str = _TIMM_BACKBONE) -> list[Rule]:
    """Rules renaming a torchvision ResNet stored under ``src`` to a timm ResNet under ``dst``.

    Args:
        src: upstream prefix, e.g. ``"backbone.model."`` (named children) or ``"backbone.net."``
            (``nn.Sequential`` of the children).
        sequential: whether the children are addressed by their ``nn.Sequential`` index.
    """
    source = re.escape(src)
    if not sequential:
        return [(source + r"(conv1|bn1|layer[1-4])\.(.+)", dst + r"\1.\2")]
    return [
        (source + rf"{index}\.(.+)", dst + rf"{name}.\1")
        for index, name in enumerate(_RESNET_CHILDREN)
        if name is not None
    ]


def dinov2_rules(src: str, *, dst: str = _TIMM_BACKBONE, drop_norm: bool = False) -> list[Rule]:
    """Rules renaming a DINOv2 hub model stored under ``src`` to a timm DINOv2 ViT under ``dst``.

    Args:
        drop_norm: drop the final ``norm.*`` (for heads such as BoQ that read the blocks' output
            before the final LayerNorm: the checkpoint may still hold it, the model does not).
    """
    source = re.escape(src)
    return [
        # Masked-image-modelling token of DINOv2's training: never used to encode an image.
        (source + r"mask_token", None),
        (source + r"register_tokens", dst + "reg_token"),
        (source + r"norm\.(weight|bias)", None if drop_norm else dst + r"norm.\1"),
        (source + r"(cls_token|pos_embed|patch_embed\.proj\.(?:weight|bias))", dst + r"\1"),
        # FSDP "block chunks": blocks.<chunk>.<index>.<layer>... -> blocks.<index>.<layer>...
        (source + r"blocks\.\d+\.(\d+)\.([a-z].*)", dst + r"blocks.\1.\2"),
        (source + r"blocks\.(\d+)\.([a-z].*)", dst + r"blocks.\1.\2"),
    ]


def resample_dinov2_pos_embed(pos_embed: Tensor, grid: tuple[int, int], num_prefix: int = 1) -> Tensor:
    """Resample a ``[1, num_prefix + M*M, C]`` position embedding to ``grid = (gh, gw)`` the way
    DINOv2's ``interpolate_pos_encoding`` does (bicubic, scale ``(g + 0.1) / M``, no antialias)."""
    prefix, patches = pos_embed[:, :num_prefix], pos_embed[:, num_prefix:]
    side = math.isqrt(patches.shape[1])
    if side * side != patches.shape[1]:
        raise ConversionError(f"pos_embed has {patches.shape[1]} patch positions, not a square grid")
    try:
        patches = resample_grid_dinov2(patches, (side, side), tuple(grid))
    except ValueError as error:
        raise ConversionError(str(error)) from None
    return torch.cat([prefix, patches], dim=1)


def adapt_dinov2_embeddings(
    state: Mapping[str, Tensor], model: nn.Module, *, dst: str = _TIMM_BACKBONE
) -> dict[str, Tensor]:
    """Fold the class position into ``cls_token`` for timm's register models; keep ``pos_embed`` at the
    checkpoint's grid for a backbone that resamples it by DINOv2's rule, or resample it to the ViT's
    grid for one that uses timm's (see the module docstring). ``state`` is already renamed."""
    out = dict(state)
    vit = model.get_submodule(dst.rstrip("."))
    pos_key, cls_key = dst + "pos_embed", dst + "cls_token"
    if pos_key not in out:
        raise ConversionError(f"the converted checkpoint has no {pos_key!r}")
    pos_embed = out[pos_key]
    if getattr(vit, "no_embed_class", False):
        if cls_key not in out:
            raise ConversionError(f"the converted checkpoint has no {cls_key!r}")
        out[cls_key] = out[cls_key] + pos_embed[:, :1]
        pos_embed = pos_embed[:, 1:]
        num_prefix = 0
    else:
        num_prefix = 1
    owner = model.get_submodule(dst.rstrip(".").rpartition(".")[0])
    if getattr(owner, "pos_embed_resample", "timm") == "dinov2":
        out[pos_key] = pos_embed
    else:
        out[pos_key] = resample_dinov2_pos_embed(pos_embed, tuple(vit.patch_embed.grid_size), num_prefix)
    return out
