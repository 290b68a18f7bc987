"""QAA: query-based adaptive aggregation on DINOv2 ViT-B/14, with a converter for the released weights.

J. Xiao et al., "Query-Based Adaptive Aggregation for Multi-Dataset Joint Training Toward Universal
Visual Place Recognition", arXiv:2507.03831. Original code: xjh19972/QAA; the port read for
structure, defaults and state_dict names is gmberton/VPR-methods-evaluation ``vpr_models/qaa.py`` (MIT).

Upstream facts of the Hugging Face releases ``xjh19971/QAA-{1024,2048,4096,8192}`` (that port):

- ``QAA`` is a ``PyTorchModelHubMixin`` (a ``config.json`` + ``model.safetensors`` repository) holding
  ``backbone`` (``DINOv2Backbone``: ``backbone.model.<DINOv2 hub names>``, final norm *not* applied by
  default, ``norm_layer=False``) and ``aggregator`` (``QAAAggregator``).
- aggregator keys: ``queries_{feature,score}.{queries, self_attn.*, norm_q.*}``,
  ``score.{cross_attn.*, norm_out.*, conv.*}``, the dustbin score ``dust_bin`` (read only when the
  scores are normalised by optimal transport, see below), and ``score.norm2_out.{weight,bias}`` (the
  LayerNorm of ``out_norm``, off in the port, dropped by :data:`QAA_UNUSED_RULES`).
- The 8192-D release is the default configuration (m = 64 clusters of l = 128); the m, l of the
  smaller releases are in their config.json, which is not reachable here, so only 8192 is registered.

Score normalisation of the release (``QAA(sinkhorn=...)``). The authors' ``models/aggregators/qaa.py``
(arplaboratory/QAA, read at 5d7a1e7 and 048114a) always passes the scores through SALAD's
``log_optimal_transport(p, self.dust_bin, 3)`` before aggregating; the brief of issue 22 reports a newer
version where a ``score_norm`` switch selects it. The port in VPR-methods-evaluation was contributed by the
account that publishes the released weights (its commit 24b8dfa merges "xjh19971/add-qaa - adding QAA
(ICRA 2026)") and is the only code here that loads them: it builds ``QAAAggregator(**config["agg_config"])`` from the
release's config.json, implements that config's ``out_norm`` and ``self_attn_out_norm`` switches, takes
``score_norm`` (default ``"none"``) and applies no normalisation. So the release is taken to use none:
``qaa_dinov2_vitb14.official`` sets ``sinkhorn=False``. Not confirmed against config.json itself (the
Hugging Face hub is unreachable here); if its ``agg_config.score_norm`` names the transport, flip it.
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

#: tensors of the released aggregator that its forward never reads (``out_norm`` off, as the port)
QAA_UNUSED_RULES = [
    (r"aggregator\.score\.norm2_out\.(weight|bias)", None),
]

QAA_AGGREGATOR_RULES = [
    (r"aggregator\.(queries_(?:feature|score)\.(?:queries|self_attn\.[a-z_]+(?:\.weight|\.bias)?|norm_q\.(?:weight|bias)))",
     r"head.\1"),
    (r"aggregator\.(score\.(?:cross_attn\.[a-z_]+(?:\.weight|\.bias)?|norm_out\.(?:weight|bias)|conv\.(?:weight|bias)))",
     r"head.\1"),
]


def convert_qaa(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """xjh19971/QAA ``model.safetensors`` keys -> ``qaa_dinov2_vitb14`` keys (the final norm is unused, as upstream).

    ``aggregator.dust_bin`` goes to ``head.dust_bin`` when the model normalises its scores by optimal
    transport (``sinkhorn=True``) and is dropped otherwise (its forward never reads it then).
    """
    uses_dustbin = getattr(model.get_submodule("head"), "sinkhorn", False)
    dustbin = [(r"aggregator\.dust_bin", "head.dust_bin" if uses_dustbin else None)]
    rules = dinov2_rules("backbone.model.", drop_norm=True) + dustbin + QAA_UNUSED_RULES + QAA_AGGREGATOR_RULES
    out = rename(state, rules, what="QAA (xjh19971/QAA)")
    return adapt_dinov2_embeddings(out, model)


pretrained_cfgs = {
    "qaa_dinov2_vitb14.official": PretrainedCfg(
        hf_hub_id="xjh19971/QAA-8192", hf_hub_filename="model.safetensors",
        remap=convert_qaa,
        # no score normalisation, as the authors' port that loads this file (evidence: the module docstring)
        model_kwargs={"sinkhorn": False},
        input_size=(3, DINOV2_EVAL_SIZE, DINOV2_EVAL_SIZE), interpolation="bicubic", out_dim=8192,
        recipe="xjh19971/QAA: multi-dataset joint training (see the paper); DINOv2 ViT-B/14, last 2 blocks trained",
        license="see xjh19971/QAA (the port in gmberton/VPR-methods-evaluation is MIT)",
        paper="Query-Based Adaptive Aggregation for Multi-Dataset Joint Training Toward Universal Visual Place "
              "Recognition (Xiao et al.), arXiv:2507.03831",
        code="https://github.com/xjh19972/QAA",
        notes="Evaluated at 322x322 as VPR-methods-evaluation resizes DINOv2 models. The release's config.json is not "
              "read (a file never chooses code); the registered architecture is its default m = 64, l = 128, with "
              "sinkhorn=False: the port xjh19971 contributed to VPR-methods-evaluation, which builds the "
              "model from that config.json, applies no Sinkhorn (their training code's optimal transport "
              "with a dustbin is QAA(sinkhorn=True)). No published figure is recorded in REFERENCE.md.",
    ),
}


@register_model
def qaa_dinov2_vitb14(**kwargs: Any) -> nn.Module:
    """QAA (Xiao et al., arXiv:2507.03831) on DINOv2 ViT-B/14 without the final norm (as upstream): 64 x 128 = 8192-D.

    Scores normalised by optimal transport with a dustbin, as the authors' qaa.py (``sinkhorn=False``: the port)."""
    return vpr(DINOV2_VITB14_BLOCKS, head(QAA), **kwargs)
