"""SelaVPR++ on DINOv2 ViT-B/14 and ViT-L/14: side-path MultiConvAdapters, a projected GeM float descriptor
and a 512-bit hashing branch, with the authors' released weights.

F. Lu, T. Jin, X. Lan, L. Zhang, Y. Liu, Y. Wang, C. Yuan, "SelaVPR++: Towards Seamless Adaptation of
Foundation Models for Efficient Place Recognition", T-PAMI 2025, arXiv:2502.16601. Original code:
Lu-Feng/SelaVPRplusplus (MIT); names and shapes read from it, no code taken.

Upstream facts of the released files (Lu-Feng/SelaVPRplusplus @ 56bd921, ``hubconf.py``, ``model/network.py``,
``model/vision_transformer.py``, ``model/adapter.py``, ``parser.py``, ``test_rerank.py``):

- ``hubconf.py`` wraps ``GeoLocalizationNet`` in ``nn.DataParallel`` and loads the file's
  ``["model_state_dict"]`` strictly: every key starts with ``module.`` (unwrapped by the reader).
- ``backbone = vit_base | vit_large(patch_size=14, img_size=518, init_values=1, block_chunks=0)``: DINOv2 hub
  names under ``backbone.`` (``pos_embed`` [1, 1370, C], ``mask_token``, ``blocks.{i}.*``, ``norm``), DINOv2's
  position resampling (offset 0.1); ``backbone.adapters.{j}`` = ``MulConvAdapter(768, 384, 192, 24, 96, 24, 96)``
  x 12 (ViT-B) or ``MulConvAdapter(1024, 512, 256, 32, 128, 32, 128)`` x 16 (ViT-L, after blocks 8-23), names
  ``D_fc{1,2}``, ``branch1.{conv,bn}``, ``branch{2,3}.{0,1}.{conv,bn}``; the "rerank" files add
  ``backbone.adapters_hashing.{j}`` (same layout).
- Head (``--aggregation gem``): ``linear1`` (C -> C), ``aggregation = Sequential(L2Norm, GeM, Flatten)`` ->
  ``aggregation.1.p``, ``linear2`` (C -> 2048 ViT-B / 4096 ViT-L); hashing: ``linear3`` (C -> C),
  ``aggregation_hashing.1.p``, ``linear4`` (C -> 512).
- Evaluation ``--resize 322 322``; two-branch: ``faiss.IndexBinaryFlat(512)`` over ``np.packbits`` of the codes,
  Hamming top ``max(--recall_values)`` = 100, re-ordered by the L2 distance of the float descriptors
  (aggzoo: ``evaluation.search.index=BFlat evaluation.search.refine=100``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from aggzoo.hub.cfg import PretrainedCfg
from aggzoo.hub.registry import register_model
from aggzoo.hub.remap import rename
from aggzoo.models.backbones.side_adapter import SideAdapterViT
from aggzoo.models.heads.selavprpp import SelaVPRpp
from aggzoo.zoo._backbones import DINOV2_EVAL_SIZE, adapt_dinov2_embeddings, backbone, dinov2_rules, head, vpr

__all__ = ["SELAVPRPP_EVAL_SIZE", "convert_selavprpp", "selavprpp_dinov2_vitb14", "selavprpp_dinov2_vitl14"]

#: ``parser.py --resize 322 322`` (a 23 x 23 patch map).
SELAVPRPP_EVAL_SIZE = DINOV2_EVAL_SIZE


def _side_backbone(model_name: str, start_block: int, hashing: bool) -> dict[str, Any]:
    return backbone(model_name, cls=SideAdapterViT, start_block=start_block, hashing=hashing,
                    img_size=SELAVPRPP_EVAL_SIZE, dynamic_img_size=True, pos_embed_resample="dinov2")


_RULES = [
    # Before the DINOv2 rules; the side-path adapters keep their names under backbone.
    (r"backbone\.(adapters(?:_hashing)?\.\d+\..+)", r"backbone.\1"),
    (r"linear1\.(weight|bias)", r"head.float_branch.token.\1"),
    (r"linear2\.(weight|bias)", r"head.float_branch.out.\1"),
    (r"aggregation\.1\.p", "head.float_branch.gem.p"),
    (r"linear3\.(weight|bias)", r"head.hash_branch.token.\1"),
    (r"linear4\.(weight|bias)", r"head.hash_branch.out.\1"),
    (r"aggregation_hashing\.1\.p", "head.hash_branch.gem.p"),
]


def convert_selavprpp(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """Lu-Feng/SelaVPRplusplus ``model_state_dict`` keys (``module.`` removed) -> ``selavprpp_dinov2_vit{b,l}14``
    keys (float files into ``hashing=False`` models, ``*_rerank`` files into ``hashing=True`` ones)."""
    out = rename(state, _RULES + dinov2_rules("backbone."), what="SelaVPR++ (Lu-Feng/SelaVPRplusplus)")
    return adapt_dinov2_embeddings(out, model)


_RELEASE = "https://github.com/Lu-Feng/SelaVPRplusplus/releases/download/SelaVPR%2B%2B/"
_RERANK_NOTE = ("Two-branch figures: the Hamming top 100 of the 512-bit codes re-ordered by the float descriptors "
                "(eval.py evaluation.search.index=BFlat evaluation.search.refine=100); evaluation.search.index=Flat gives "
                "the float branch alone.")


_SCRIPT = {False: "train.py", True: "train_rerank.py (from the float model, hashing branch only)"}


def _hashing(hashing: bool) -> dict[str, bool]:
    """The head's ``hashing`` keyword when it differs from the default (the head spec states only what differs)."""
    return {"hashing": True} if hashing else {}


def _release(filename: str, size: str, out_dim: int, metrics: Mapping[str, float], *, rerank: bool) -> PretrainedCfg:
    return PretrainedCfg(
        url=_RELEASE + filename,
        hf_hub_id="fenglu96/SelaVPRplusplus", hf_hub_filename=filename,
        filename=filename,
        remap=convert_selavprpp,
        model_kwargs=_hashing(rerank),
        input_size=(3, SELAVPRPP_EVAL_SIZE, SELAVPRPP_EVAL_SIZE), interpolation="bicubic", out_dim=out_dim,
        recipe=(f"Lu-Feng/SelaVPRplusplus {_SCRIPT[rerank]} on the unified dataset (SF-XL + MSLS cities + "
                f"Pitts30k), DINOv2 {size}, 120 places x 4, 224, "
                "RandAugment(3), MS loss, Adam 4e-4, StepLR x0.5 / 3 epochs, 25 epochs; conf/experiment/selavprpp_dinov2.yaml"),
        license="MIT (Lu-Feng/SelaVPRplusplus)",
        paper="SelaVPR++: Towards Seamless Adaptation of Foundation Models for Efficient Place Recognition (Lu et al., "
              "T-PAMI 2025), arXiv:2502.16601",
        code="https://github.com/Lu-Feng/SelaVPRplusplus",
        metrics=metrics,
        notes=("Figures from the authors' README (unified-data models); Nordland = the +-10-frame protocol. "
               + (_RERANK_NOTE if rerank else "")).strip(),
    )


def _figures(pitts: float, msls: float, nordland: float) -> dict[str, float]:
    return {"pitts30k_test/R@1": pitts, "msls_val/R@1": msls, "nordland_10frames/R@1": nordland}


pretrained_cfgs = {
    "selavprpp_dinov2_vitb14.official": _release("SelaVPRplusplus_base.pth", "ViT-B/14", 2048,
                                                 _figures(93.3, 94.3, 94.7), rerank=False),
    "selavprpp_dinov2_vitb14.official_rerank": _release("SelaVPRplusplus_base_rerank.pth", "ViT-B/14", 2048,
                                                        _figures(93.3, 94.5, 94.6), rerank=True),
    "selavprpp_dinov2_vitl14.official": _release("SelaVPRplusplus_large.pth", "ViT-L/14", 4096,
                                                 _figures(94.4, 94.3, 97.0), rerank=False),
    "selavprpp_dinov2_vitl14.official_rerank": _release("SelaVPRplusplus_large_rerank.pth", "ViT-L/14", 4096,
                                                        _figures(94.4, 94.5, 97.2), rerank=True),
}


@register_model
def selavprpp_dinov2_vitb14(*, hashing: bool = False, **kwargs: Any) -> nn.Module:
    """SelaVPR++: frozen DINOv2 ViT-B/14 with a side path of 12 MultiConvAdapters; projected GeM, 2048-D
    (``hashing=True``: plus the 512-bit hashing branch for a binary first stage)."""
    return vpr(_side_backbone("vit_base_patch14_dinov2", 0, hashing),
               head(SelaVPRpp, **_hashing(hashing)), **kwargs)


@register_model
def selavprpp_dinov2_vitl14(*, hashing: bool = False, **kwargs: Any) -> nn.Module:
    """SelaVPR++: frozen DINOv2 ViT-L/14 with a side path of 16 MultiConvAdapters from block 8; projected GeM,
    4096-D (``hashing=True``: plus the 512-bit hashing branch for a binary first stage)."""
    return vpr(_side_backbone("vit_large_patch14_dinov2", 8, hashing),
               head(SelaVPRpp, out_dim=4096, **_hashing(hashing)), **kwargs)
