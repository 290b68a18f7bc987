"""MegaLoc official weights (Hugging Face ``gberton/MegaLoc`` ``model.safetensors``) -> ``megaloc_dinov2_vitb14``.

Upstream facts (gmberton/MegaLoc ``megaloc_model.py`` and ``hubconf.py``, MIT):

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

from torch import Tensor, nn

from aggzoo.convert.backbones import adapt_dinov2_embeddings, dinov2_rules
from aggzoo.convert.common import rename

__all__ = ["convert_megaloc"]

_AGGREGATOR_RULES = [
    (r"aggregator\.agg\.((?:token_features\.[02]|cluster_features\.[03]|score\.[03])\.(?:weight|bias)|dust_bin)",
     r"head.agg.\1"),
    (r"aggregator\.linear\.(weight|bias)", r"head.linear.\1"),
]


def convert_megaloc(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """gmberton/MegaLoc ``model.safetensors`` keys -> ``megaloc_dinov2_vitb14`` keys."""
    out = rename(state, dinov2_rules("backbone.") + _AGGREGATOR_RULES, what="MegaLoc (gmberton/MegaLoc)")
    return adapt_dinov2_embeddings(out, model)
