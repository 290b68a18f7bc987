"""FoL on DINOv2 ViT-B/14 and ViT-L/14: attention-guided SALAD descriptor and reliable-region local
features for re-ranking, with the authors' released weights.

C. Wang, S. Chen, Y. Song, R. Xu, Z. Zhang, J. Zhang, H. Yang, Y. Zhang, K. Fu, S. Du et al., "Focus on
Local: Finding Reliable Discriminative Regions for Visual Place Recognition" (FoL), AAAI 2025,
arXiv:2504.09881. Original code: chenshunpeng/FoL (Apache-2.0); names and shapes read from it, no code taken.

Upstream facts of the released files (chenshunpeng/FoL @ e930a76, ``hubconf.py``, ``network_FoL.py``,
``backbone/dinov2_FoL.py``, ``aggregators/FoL.py``, ``util.py``, ``parser.py``, ``test_FoL.py``):

- ``hubconf.py``: ``FoL_large.pth`` (ViT-L/14, C = 1024) and ``FoL_base.pth`` (ViT-B/14, C = 768) on the
  Hugging Face repo ``shunpeng/FoL``; each holds ``["model_state_dict"]`` of ``DataParallel(FoLNet)`` (``module.``
  prefixes, unwrapped by the reader, as upstream's loader strips them).
- ``FoLNet``: ``backbone.model`` = the torch.hub DINOv2 (``backbone.model.<hub names>``: ``cls_token``,
  ``pos_embed`` [1, 1370, C], ``mask_token``, ``patch_embed.proj``, ``blocks.{i}``, ``norm``; final norm applied,
  last 4 blocks trained), ``aggregator.{token_features.{0,2}, cluster_features.{0,3}, score.{0,3}}`` (SALAD's
  MLPs, no dustbin parameter), ``upconv`` (ConvTranspose2d C -> 256) and ``upconv2`` (256 -> 128).
- Evaluation: ``--resize 504 504`` by default (the README's main table; a second table at 322), a tensor resize
  after normalisation (bilinear, torchvision 0.15: no antialias), ``faiss.IndexFlatL2`` over 8448-D, then the
  top ``max(--recall_values)`` = 100 re-ranked by thresholded mutual nearest neighbours of the local features
  (``evaluation.rerank.method=fol``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from aggzoo.hub.cfg import PretrainedCfg
from aggzoo.hub.registry import register_model
from aggzoo.hub.remap import rename
from aggzoo.models.backbones.class_attention import ClassAttentionViT
from aggzoo.models.heads.fol import FoL
from aggzoo.zoo._backbones import DINOV2_EVAL_SIZE, adapt_dinov2_embeddings, backbone, dinov2_rules, head, vpr
from aggzoo.zoo.salad import SALAD_AGGREGATOR_RULES

__all__ = ["FOL_EVAL_SIZE", "convert_fol", "fol_dinov2_vitb14", "fol_dinov2_vitl14"]

#: ``parser.py --resize`` default (504 x 504, a 36 x 36 patch map): the README's main table.
FOL_EVAL_SIZE = 504


def _fol_backbone(model_name: str, depth: int) -> dict[str, Any]:
    # Last 4 blocks trained (FoLNet(num_trainable_blocks=4)); the final norm is applied (norm_layer=True).
    return backbone(model_name, cls=ClassAttentionViT, img_size=DINOV2_EVAL_SIZE, dynamic_img_size=True,
                    frozen_stages=depth - 4, pos_embed_resample="dinov2")


_RULES = [
    (r"upconv\.(weight|bias)", r"head.local_adapt.upconv1.\1"),
    (r"upconv2\.(weight|bias)", r"head.local_adapt.upconv2.\1"),
]


def convert_fol(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """chenshunpeng/FoL ``model_state_dict`` keys (``module.`` removed) -> ``fol_dinov2_vit{b,l}14`` keys."""
    out = rename(state, dinov2_rules("backbone.model.") + SALAD_AGGREGATOR_RULES + _RULES,
                 what="FoL (chenshunpeng/FoL)")
    return adapt_dinov2_embeddings(out, model)


_PAPER = ("Focus on Local: Finding Reliable Discriminative Regions for Visual Place Recognition (Wang et al., "
          "AAAI 2025), arXiv:2504.09881")
_RECIPE = ("chenshunpeng/FoL train.py: GSV-Cities (23 cities, 4 images per place), 60 places per batch, 322 x 322, "
           "AdamW 6e-5 (weight decay 9.5e-9), LinearLR 1 -> 0.1 over 10000 steps, 8 epochs, AMP, last 4 DINOv2 "
           "blocks; MS loss + local MNN triplet + 5e-3 (KL_1 + KL_2) + separation + weak supervision "
           "(conf/experiment/fol_dinov2.yaml)")
_RERANKED = ("Figures after re-ranking the global top 100 by the local features (eval.py "
             "evaluation.rerank.method=fol); the README lists the global descriptor's alone beside them: {}. "
             "The authors' resize is a tensor bilinear resize without antialiasing; aggzoo's protocol resize "
             "antialiases (small differences expected).")


def _release(filename: str, size: str, drive_id: str, input_side: int, metrics: Mapping[str, float],
             notes: str) -> PretrainedCfg:
    return PretrainedCfg(
        hf_hub_id="shunpeng/FoL", hf_hub_filename=filename,
        download_page=f"https://drive.google.com/file/d/{drive_id}/view",
        filename=filename,
        remap=convert_fol,
        input_size=(3, input_side, input_side), interpolation="bilinear", eval_metric="l2", out_dim=8448,
        recipe=f"{_RECIPE}; DINOv2 {size}",
        license="Apache-2.0 (chenshunpeng/FoL)",
        paper=_PAPER,
        code="https://github.com/chenshunpeng/FoL",
        metrics=metrics,
        notes=notes,
    )


pretrained_cfgs = {
    # README "Performance" table: ViT-L at 504 x 504, re-ranked R@1.
    "fol_dinov2_vitl14.official": _release(
        "FoL_large.pth", "ViT-L/14", "1-7LE_4Q0zL3S8lGVEH0Ob1NCFXq4KfJ8", FOL_EVAL_SIZE,
        {"pitts250k_test/R@1": 97.0, "msls_val/R@1": 93.5, "msls_challenge/R@1": 80.0, "tokyo247/R@1": 98.4,
         "pitts30k_test/R@1": 94.5, "sped/R@1": 91.8},
        _RERANKED.format("Pitts250k 96.5, MSLS-val 93.1, MSLS-challenge 78.7, Tokyo24/7 96.2, Pitts30k 93.9, SPED "
                         "92.1") + " Also re-ranked: AmsterTime 70.1, Eynsham 92.4, Nordland* (2760 summer queries, "
        "27592 winter database) 85.8, Nordland** (27592 winter queries) 92.6 (README 'Performance' table)."),
    # README "Additional Results at 322x322" table: ViT-B, re-ranked R@1.
    "fol_dinov2_vitb14.official": _release(
        "FoL_base.pth", "ViT-B/14", "1Z05ZLFliQXOPJMH1YPdXqYjzC15-0nam", DINOV2_EVAL_SIZE,
        {"pitts30k_test/R@1": 93.1, "msls_val/R@1": 91.5, "tokyo247/R@1": 97.5},
        _RERANKED.format("Pitts30k 92.1, MSLS-val 91.1, Tokyo24/7 94.6") + " Figures from the README's 'Additional "
        "Results at 322x322' table (the only ViT-B figures); also re-ranked there: Nordland* 78.2, Nordland** 85.4, "
        "Eynsham 91.3."),
}


@register_model
def fol_dinov2_vitb14(**kwargs: Any) -> nn.Module:
    """FoL on DINOv2 ViT-B/14 (last 4 blocks trained): 8448-D, plus up to 3600 x 128 reliable-region local
    features for re-ranking (evaluation.rerank.method=fol)."""
    return vpr(_fol_backbone("vit_base_patch14_dinov2", 12), head(FoL), **kwargs)


@register_model
def fol_dinov2_vitl14(**kwargs: Any) -> nn.Module:
    """FoL on DINOv2 ViT-L/14 (last 4 blocks trained): 8448-D, plus reliable-region local features."""
    return vpr(_fol_backbone("vit_large_patch14_dinov2", 24), head(FoL), **kwargs)
