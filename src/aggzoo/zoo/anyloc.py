"""AnyLoc-VLAD-DINOv2: hard-assignment VLAD over DINOv2 ViT-G/14 value facets, with the authors' domain vocabularies.

N. Keetha, A. Mishra, J. Karhade, K. M. Jatavallabhula, S. Scherer, M. Krishna, S. Garg, "AnyLoc: Towards
Universal Visual Place Recognition", RA-L 2023, arXiv:2308.00688. Original code: AnyLoc/AnyLoc and the
torch.hub repository AnyLoc/DINO (both BSD-3-Clause); facts only, no code taken.

Upstream facts (AnyLoc/DINO@eea7d4c ``hubconf.py``, ``model_wrapper.py``, ``dinov2_extractor.py``, ``utilities.py``):

- ``get_vlad_model(domain, backbone="DINOv2", vit_model="ViT-G/14", vit_layer=31, vit_facet="Value", num_c=32)``
  builds ``AnyLocVladDinov2``: the ``dinov2_vitg14`` torch.hub model with a forward hook on
  ``blocks[31].attn.qkv`` (the value third of its output), the class token dropped, the features
  L2-normalised, then ``VLAD(32)`` with the domain's centres: D = 32 x 1536 = 49152.
- Released vocabularies: ``https://github.com/AnyLoc/DINO/releases/download/v1/`` +
  ``dinov2_vitg14_l31_value_c32_<domain>_c_centers.pt`` for domain in indoor, urban, aerial, structured,
  unstructured, global. Each file is ``torch.save`` of one bare tensor ``[32, 1536]`` (``VLAD.c_centers``,
  the ``fast_pytorch_kmeans`` cosine-mode centroids: members' means, not unit norm); the hub asserts
  ``c_centers.shape[0] == num_c``. :func:`convert_anyloc_vocabulary` places it at ``head.centroids``; the
  backbone is DINOv2's own pretrained ViT-G/14 (``contents="delta"``).
- Images: AnyLoc/AnyLoc ``scripts/dino_v2_global_vocab_vlad.py`` (how the domain vocabularies were fitted and
  evaluated) resizes every image to 320 x 320 (torchvision ``Resize``, bilinear), normalises with the
  ImageNet mean/std and centre-crops to the largest multiple of 14 (308 x 308, 22 x 22 patches).
- Vocabulary domains (same script's docstring): indoor = Baidu Mall, Gardens Point, 17 Places; urban = Oxford,
  St Lucia, Pitts-30k (every 4th database image); aerial = Tartan-GNSS (rotated, not rotated), VP-Air (every
  2nd); structured = indoor + urban; unstructured = Tartan-GNSS, Hawkins, Laurel Caverns, Eiffel, VP-Air;
  global = structured + unstructured. All database images' patch features of those sets are clustered.

Checked against the authors' whole ``AnyLocVladDinov2`` (DINOv2 hub code, random weights converted with
:func:`~aggzoo.zoo._backbones.dinov2_rules`, fp32, 2 x 3 x 224 x 252): max abs difference 5.6e-9 on ViT-G/14
block 31 (the facets identical), 7.5e-9 on ViT-S/14 block 9; timm's ``vit_giant_patch14_dinov2`` computes
DINOv2's SwiGLU (hub ``mlp.w12`` / ``mlp.w3`` = timm ``mlp.fc1`` / ``mlp.fc2``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from aggzoo.errors import ConversionError
from aggzoo.hub.cfg import PretrainedCfg
from aggzoo.hub.checkpoint import BARE_TENSOR_KEY
from aggzoo.hub.registry import register_model
from aggzoo.models.backbones.vit_facet import ViTFacet
from aggzoo.models.heads.anyloc import AnyLocVLAD
from aggzoo.zoo._backbones import backbone, head, vpr

__all__ = ["ANYLOC_DOMAINS", "DINOV2_VITG14_L31_VALUE", "anyloc_dinov2_vitg14", "convert_anyloc_vocabulary"]

#: DINOv2 ViT-G/14, the value facet of block 31 (of 40; the later blocks are not built), every block frozen.
#: The position grid stays DINOv2's 37 x 37 and is resampled per input by DINOv2's rule, as the hub model does.
DINOV2_VITG14_L31_VALUE = backbone(
    "vit_giant_patch14_dinov2", cls=ViTFacet, block=31, facet="value", frozen_stages=32, dynamic_img_size=True,
    pos_embed_resample="dinov2",
)

#: the domains of the released vocabularies, the hub's default (indoor) first
ANYLOC_DOMAINS = ("indoor", "urban", "aerial", "structured", "unstructured", "global")
_RELEASE_URL = "https://github.com/AnyLoc/DINO/releases/download/v1/"


def convert_anyloc_vocabulary(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """A released ``c_centers.pt`` (one bare tensor ``[K, C]``) -> ``{"head.centroids": [K, C]}`` (float32)."""
    if set(state) != {BARE_TENSOR_KEY}:
        raise ConversionError("an AnyLoc vocabulary file holds one bare tensor (torch.save(c_centers), "
                              f"[num_clusters, channels]); this file holds the keys {sorted(state)[:8]}")
    centres = state[BARE_TENSOR_KEY]
    if centres.ndim != 2 or not centres.is_floating_point():
        raise ConversionError(f"an AnyLoc vocabulary is a float [num_clusters, channels] tensor, got "
                              f"{centres.dtype} {tuple(centres.shape)}")
    return {"head.centroids": centres.to(torch.float32)}


pretrained_cfgs = {
    f"anyloc_dinov2_vitg14.{domain}": PretrainedCfg(
        url=f"{_RELEASE_URL}dinov2_vitg14_l31_value_c32_{domain}_c_centers.pt",
        contents="delta",
        remap=convert_anyloc_vocabulary,
        input_size=(3, 320, 320), interpolation="bilinear", out_dim=32 * 1536,
        recipe=f"AnyLoc/AnyLoc scripts/dino_v2_global_vocab_vlad.py: cosine k-means (32 centres, "
               f"fast_pytorch_kmeans) of the DINOv2 ViT-G/14 block-31 value features of the '{domain}' "
               "domain's database images at 320 x 320 cropped to 308 x 308",
        license="BSD-3-Clause (AnyLoc/DINO); the backbone: DINOv2 (Apache-2.0)",
        paper="AnyLoc: Towards Universal Visual Place Recognition (Keetha et al., RA-L 2023), arXiv:2308.00688",
        code="https://github.com/AnyLoc/DINO",
        notes=f"Vocabulary '{domain}' of torch.hub AnyLoc/DINO get_vlad_model(domain='{domain}'); training-free. "
              "The authors resize to 320 x 320 and centre-crop to 308 x 308 (multiples of 14). Not pinned: "
              "no digest could be taken here.",
    )
    for domain in ANYLOC_DOMAINS
}


@register_model
def anyloc_dinov2_vitg14(**kwargs: Any) -> nn.Module:
    """AnyLoc-VLAD-DINOv2: hard VLAD (K = 32) over DINOv2 ViT-G/14 block-31 value facets: 49152-D."""
    return vpr(DINOV2_VITG14_L31_VALUE, head(AnyLocVLAD), **kwargs)
