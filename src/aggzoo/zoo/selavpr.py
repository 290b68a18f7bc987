"""SelaVPR on DINOv2 ViT-L/14 with its global adapters and local adaptation, with the authors' weights.

F. Lu, L. Zhang, X. Lan, S. Dong, Y. Wang, C. Yuan, "Towards Seamless Adaptation of Pre-trained
Models for Visual Place Recognition" (SelaVPR), ICLR 2024, arXiv:2402.14505. Original code:
Lu-Feng/SelaVPR (MIT); names and shapes read from it, no code taken.

Upstream facts of the released files (Lu-Feng/SelaVPR @ cf6e206, ``network.py``,
``backbone/dinov2/block.py``, ``test.py``, ``parser.py``):

- ``self.backbone = vit_large(patch_size=14, img_size=518, init_values=1, block_chunks=0[,
  num_register_tokens=4])`` (``--registers``): DINOv2 hub names under ``backbone.`` (``pos_embed``
  [1, 1370, 1024], ``mask_token``, ``register_tokens``, ``blocks.{0..23}.*``, ``norm``), DINOv2's
  position resampling (offset 0.1), plus ``backbone.blocks.{i}.adapter{1,2}.D_fc{1,2}`` (1024 <-> 512).
- ``self.aggregation = nn.Sequential(L2Norm(), GeM(), Flatten())`` -> ``aggregation.1.p``;
  ``self.LocalAdapt.upconv{1,2}`` (ConvTranspose2d 1024 -> 256 -> 128).
- Saved as ``{"model_state_dict": DataParallel(model).state_dict(), ...}``: ``module.`` prefixes.
- Evaluation at 224 x 224 (``--resize``; the model views its patches as 16 x 16), re-ranking the global
  top ``--rerank_num`` = 100 (:mod:`aggzoo.evaluation.local_rerank`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from aggzoo.hub.cfg import PretrainedCfg
from aggzoo.hub.registry import register_model
from aggzoo.hub.remap import rename
from aggzoo.models.backbones.sela_adapter import SelaAdapterViT
from aggzoo.models.heads.selavpr import SelaVPR
from aggzoo.zoo._backbones import adapt_dinov2_embeddings, backbone, dinov2_rules, head, vpr

__all__ = ["SELAVPR_EVAL_SIZE", "convert_selavpr", "selavpr_dinov2_vitl14", "selavpr_dinov2_vitl14_reg4"]

#: 224 x 224: the 16 x 16 patch map upstream's model is written for.
SELAVPR_EVAL_SIZE = 224


def _sela_backbone(model_name: str) -> dict[str, Any]:
    return backbone(model_name, cls=SelaAdapterViT, adapter_scale=0.2, img_size=SELAVPR_EVAL_SIZE,
                    dynamic_img_size=True, pos_embed_resample="dinov2")


_RULES = [
    # Before the DINOv2 block rule, which would match these keys too.
    (r"backbone\.blocks\.(\d+)\.(adapter[12]\.D_fc[12]\.(?:weight|bias))", r"backbone.adapters.\1.\2"),
    (r"aggregation\.1\.p", "head.gem.p"),
    (r"LocalAdapt\.(upconv[12]\.(?:weight|bias))", r"head.local_adapt.\1"),
]


def convert_selavpr(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """Lu-Feng/SelaVPR ``model_state_dict`` keys (``module.`` removed) -> ``selavpr_dinov2_vitl14*`` keys."""
    out = rename(state, _RULES + dinov2_rules("backbone."), what="SelaVPR (Lu-Feng/SelaVPR)")
    return adapt_dinov2_embeddings(out, model)


def _release(drive_id: str, filename: str, data: str, **fields: Any) -> PretrainedCfg:
    return PretrainedCfg(
        download_page=f"https://drive.google.com/file/d/{drive_id}/view",
        filename=filename,
        remap=convert_selavpr,
        input_size=(3, SELAVPR_EVAL_SIZE, SELAVPR_EVAL_SIZE), interpolation="bicubic", out_dim=1024,
        recipe=f"Lu-Feng/SelaVPR train.py on {data} (triplets with partial mining, Adam 1e-5, 224; global "
               "triplet + local MNN loss)",
        license="MIT (Lu-Feng/SelaVPR)",
        paper="Towards Seamless Adaptation of Pre-trained Models for Visual Place Recognition (Lu et al., "
              "ICLR 2024), arXiv:2402.14505",
        code="https://github.com/Lu-Feng/SelaVPR",
        **fields,
    )


_RERANKED = ("Figures are after re-ranking the global top 100 by mutual nearest neighbours of the local "
             "features (aggzoo.evaluation.local_rerank.evaluate_with_local_rerank); the global descriptor alone "
             "scores lower. Matching a figure to a file by its training set is ours.")

pretrained_cfgs = {
    "selavpr_dinov2_vitl14.official": _release(
        "1vy05l0JTEgr6n8iSoz_P_yjWfEzFPAkV", "SelaVPR_msls.pth", "MSLS",
        metrics={"msls_val/R@1": 90.8, "tokyo247/R@1": 94.0}, notes=_RERANKED),
    "selavpr_dinov2_vitl14.official_pitts30k": _release(
        "1LKTZZRHfMH3dY3UPagCt2TIlMN5LguGO", "SelaVPR_pitts30k.pth", "MSLS, then Pitts30k",
        metrics={"pitts30k_test/R@1": 92.8}, notes=_RERANKED),
    "selavpr_dinov2_vitl14_reg4.official": _release(
        "16Qkr6MGe3k0kYtFfw3YLQXZFn4c9YvJk", "SelaVPR_reg4_msls.pth", "MSLS (--registers)",
        notes="DINOv2 with 4 registers. No figure for this file is recorded in REFERENCE.md."),
}


@register_model
def selavpr_dinov2_vitl14(**kwargs: Any) -> nn.Module:
    """SelaVPR: frozen DINOv2 ViT-L/14 with serial + parallel adapters; GeM global descriptor (1024-D) and
    61 x 61 x 128 local features at 224 x 224 for mutual-nearest-neighbour re-ranking."""
    return vpr(_sela_backbone("vit_large_patch14_dinov2"), head(SelaVPR), **kwargs)


@register_model
def selavpr_dinov2_vitl14_reg4(**kwargs: Any) -> nn.Module:
    """SelaVPR on DINOv2 ViT-L/14 with 4 registers: 1024-D (+ local features)."""
    return vpr(_sela_backbone("vit_large_patch14_reg4_dinov2"), head(SelaVPR), **kwargs)
