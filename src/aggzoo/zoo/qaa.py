"""QAA: query-based adaptive aggregation on DINOv2 ViT-B/14, with a converter for the released weights.

J. Xiao et al., "Query-Based Adaptive Aggregation for Multi-Dataset Joint Training Toward Universal
Visual Place Recognition", arXiv:2507.03831. Original code: xjh19972/QAA; the port read for
structure, defaults and state_dict names is gmberton/VPR-methods-evaluation ``vpr_models/qaa.py`` (MIT).

Upstream facts of the Hugging Face releases ``xjh19971/QAA-{1024,2048,4096,8192}`` (that port):

- ``QAA`` is a ``PyTorchModelHubMixin`` (a ``config.json`` + ``model.safetensors`` repository) holding
  ``backbone`` (``DINOv2Backbone``: ``backbone.model.<DINOv2 hub names>``, final norm *not* applied by
  default, ``norm_layer=False``) and ``aggregator`` (``QAAAggregator``).
- aggregator keys: ``queries_{feature,score}.{queries, self_attn.*, norm_q.*}``,
  ``score.{cross_attn.*, norm_out.*, conv.*}``, plus three tensors its forward never reads (dropped
  by :data:`QAA_UNUSED_RULES`): ``dust_bin`` (a scalar left from SALAD; QAA has no dustbin) and
  ``score.norm2_out.{weight,bias}`` (the LayerNorm of ``out_norm``, off by default).
- The 8192-D release is the default configuration (m = 64 clusters of l = 128); the m, l of the
  smaller releases are in their config.json, which is not reachable here, so only 8192 is registered.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from aggzoo.hub.cfg import PretrainedCfg
from aggzoo.hub.registry import register_model
from aggzoo.hub.remap import rename
from aggzoo.models.heads.qaa import QAA
from aggzoo.zoo._backbones import DINOV2_EVAL_SIZE, DINOV2_VITB14_BLOCKS, adapt_dinov2_embeddings, dinov2_rules, head, vpr

__all__ = ["QAA_AGGREGATOR_RULES", "QAA_UNUSED_RULES", "convert_qaa", "qaa_dinov2_vitb14"]

#: tensors of the released aggregator that its forward never reads
QAA_UNUSED_RULES = [
    (r"aggregator\.dust_bin", None),
    (r"aggregator\.score\.norm2_out\.(weight|bias)", None),
]

QAA_AGGREGATOR_RULES = [
    (r"aggregator\.(queries_(?:feature|score)\.(?:queries|self_attn\.[a-z_]+(?:\.weight|\.bias)?|norm_q\.(?:weight|bias)))",
     r"head.\1"),
    (r"aggregator\.(score\.(?:cross_attn\.[a-z_]+(?:\.weight|\.bias)?|norm_out\.(?:weight|bias)|conv\.(?:weight|bias)))",
     r"head.\1"),
]


def convert_qaa(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """xjh19971/QAA ``model.safetensors`` keys -> ``qaa_dinov2_vitb14`` keys (the final norm is unused, as upstream)."""
    rules = dinov2_rules("backbone.model.", drop_norm=True) + QAA_UNUSED_RULES + QAA_AGGREGATOR_RULES
    out = rename(state, rules, what="QAA (xjh19971/QAA)")
    return adapt_dinov2_embeddings(out, model)


pretrained_cfgs = {
    "qaa_dinov2_vitb14.official": PretrainedCfg(
        hf_hub_id="xjh19971/QAA-8192", hf_hub_filename="model.safetensors",
        remap=convert_qaa,
        input_size=(3, DINOV2_EVAL_SIZE, DINOV2_EVAL_SIZE), interpolation="bicubic", out_dim=8192,
        recipe="xjh19971/QAA: multi-dataset joint training (see the paper); DINOv2 ViT-B/14, last 2 blocks trained",
        license="see xjh19971/QAA (the port in gmberton/VPR-methods-evaluation is MIT)",
        paper="Query-Based Adaptive Aggregation for Multi-Dataset Joint Training Toward Universal Visual Place "
              "Recognition (Xiao et al.), arXiv:2507.03831",
        code="https://github.com/xjh19972/QAA",
        notes="Evaluated at 322x322 as VPR-methods-evaluation resizes DINOv2 models. The release's config.json is not "
              "read (a file never chooses code); the registered architecture is its default m = 64, l = 128. No "
              "published figure is recorded in REFERENCE.md.",
    ),
}


@register_model
def qaa_dinov2_vitb14(**kwargs: Any) -> nn.Module:
    """QAA (Xiao et al., arXiv:2507.03831) on DINOv2 ViT-B/14 without the final norm (as upstream): 64 x 128 = 8192-D."""
    return vpr(DINOV2_VITB14_BLOCKS, head(QAA), **kwargs)
