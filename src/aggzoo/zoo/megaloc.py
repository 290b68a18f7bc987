"""MegaLoc: SALAD with wider clusters and a final projection, trained on many datasets; the authors' weights.

G. Berton, C. Masone, "MegaLoc: One Retrieval to Place Them All", CVPR Workshops 2025,
arXiv:2502.17237. Original code: gmberton/MegaLoc (MIT).

Upstream facts of ``model.safetensors`` (Hugging Face ``gberton/MegaLoc``; ``megaloc_model.py``, ``hubconf.py``):

- ``get_trained_model`` loads ``model.safetensors`` from the Hub with ``load_state_dict`` (strict).
- ``MegaLoc.backbone`` is the file's own DINOv2 ViT-B/14 class: ``backbone.{cls_token, pos_embed
  [1, 1370, 768], patch_embed.proj, blocks.{0..11}.{norm1, attn.qkv, attn.proj, ls1.gamma, norm2,
  mlp.fc1, mlp.fc2, ls2.gamma}, norm}`` -- DINOv2's names, without ``mask_token``; the final norm
  is applied; position embeddings are interpolated DINOv2-style (bicubic, offset 0.1, no antialias).
- ``MegaLoc.aggregator = Aggregator(agg=FeatureAggregator(...), linear=Linear(16640, 8448))``:
  ``aggregator.agg.{token_features.{0,2}, cluster_features.{0,3}, score.{0,3}, dust_bin}`` (SALAD
  with cluster_dim 256, mlp_dim 512) and ``aggregator.linear.{weight, bias}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from aggzoo.hub.cfg import PretrainedCfg
from aggzoo.hub.registry import register_model
from aggzoo.hub.remap import rename
from aggzoo.models.heads.megaloc import MegaLoc
from aggzoo.zoo._backbones import DINOV2_EVAL_SIZE, DINOV2_VITB14, adapt_dinov2_embeddings, dinov2_rules, head, vpr

__all__ = ["convert_megaloc", "megaloc_dinov2_vitb14"]

_AGGREGATOR_RULES = [
    (r"aggregator\.agg\.((?:token_features\.[02]|cluster_features\.[03]|score\.[03])\.(?:weight|bias)|dust_bin)",
     r"head.agg.\1"),
    (r"aggregator\.linear\.(weight|bias)", r"head.linear.\1"),
]


def convert_megaloc(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """gmberton/MegaLoc ``model.safetensors`` keys -> ``megaloc_dinov2_vitb14`` keys."""
    out = rename(state, dinov2_rules("backbone.") + _AGGREGATOR_RULES, what="MegaLoc (gmberton/MegaLoc)")
    return adapt_dinov2_embeddings(out, model)


pretrained_cfgs = {
    "megaloc_dinov2_vitb14.official": PretrainedCfg(
        hf_hub_id="gberton/MegaLoc", hf_hub_filename="model.safetensors",
        remap=convert_megaloc,
        input_size=(3, DINOV2_EVAL_SIZE, DINOV2_EVAL_SIZE), interpolation="bicubic", out_dim=8448,
        recipe="gmberton/MegaLoc: trained on a mix of GSV-Cities, SF-XL, MSLS and more (see the paper)",
        license="MIT (gmberton/MegaLoc)",
        paper="MegaLoc: One Retrieval to Place Them All (Berton & Masone, CVPR Workshops 2025), arXiv:2502.17237",
        code="https://github.com/gmberton/MegaLoc",
        notes="Upstream rounds any input size to a multiple of 14 (antialiased resize); 322x322 recorded here. "
              "No published figure is recorded in REFERENCE.md.",
    ),
}


@register_model
def megaloc_dinov2_vitb14(**kwargs: Any) -> nn.Module:
    """MegaLoc (SALAD with l = 256, then Linear 16640 -> 8448) on DINOv2 ViT-B/14: 8448-D."""
    return vpr(DINOV2_VITB14, head(MegaLoc), **kwargs)
