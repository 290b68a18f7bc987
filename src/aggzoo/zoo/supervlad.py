"""SuperVLAD and 1-cluster VLAD on DINOv2 ViT-B/14, with the authors' released weights.

F. Lu, X. Zhang, C. Ye, S. Dong, L. Zhang, X. Lan, C. Yuan, "SuperVLAD: Compact and Robust Image
Descriptors for Visual Place Recognition", NeurIPS 2024. Original code: Lu-Feng/SuperVLAD (MIT);
names and shapes read from it, no code taken.

Upstream facts of the released files (Lu-Feng/SuperVLAD @ d994ba4, ``model/network.py``, ``eval.py``,
``README.md``):

- The backbone is the repository's own copy of DINOv2 (``vit_base(patch_size=14, img_size=518,
  init_values=1, block_chunks=0)``), stored as ``self.backbone``: DINOv2 hub names under
  ``backbone.`` (``cls_token``, ``pos_embed`` [1, 1370, 768], ``mask_token``, ``patch_embed.proj``,
  ``blocks.{0..11}.*``, ``norm``); the head reads ``x_norm_patchtokens`` (final norm applied),
  never the CLS token. Its ``interpolate_pos_encoding`` is DINOv2's (offset 0.1), so the zoo's
  ``pos_embed_resample="dinov2"`` backbone computes the same positions.
- ``self.aggregation = SuperVLAD(...)``: one tensor, ``aggregation.conv.weight`` [K+G, 768, 1, 1]
  (no bias, no centroids).
- With ``--crossimage_encoder``: ``self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(
  768, 16, 2048, dropout 0.1, gelu, batch_first=False), 2)`` -> ``encoder.layers.{0,1}.{self_attn.
  in_proj_weight, in_proj_bias, out_proj.weight, out_proj.bias, linear1, linear2, norm1, norm2}``.
- Files are ``torch.save({"model_state_dict": ..., ...})`` of the ``nn.DataParallel`` model: every
  key starts with ``module.`` (the reader unwraps both before the converter runs).
- Evaluation at 322 x 322 (``parser.py --resize`` default); README test command with the encoder:
  ``--infer_batch_size=8`` (queries and database extracted apart, in file order).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from aggzoo.hub.cfg import PretrainedCfg
from aggzoo.hub.registry import register_model
from aggzoo.hub.remap import rename
from aggzoo.models.heads.supervlad import SuperVLAD
from aggzoo.zoo._backbones import DINOV2_EVAL_SIZE, DINOV2_VITB14, adapt_dinov2_embeddings, dinov2_rules, head, vpr

__all__ = [
    "CROSS_IMAGE_ENCODER_RULES",
    "SUPERVLAD_RULES",
    "convert_supervlad",
    "supervlad1_dinov2_vitb14",
    "supervlad_dinov2_vitb14",
    "supervladcross_dinov2_vitb14",
]

#: torch's nn.TransformerEncoder names of the cross-image encoder (``encoder.``), kept under ``head.``;
#: CricaVPR's file holds the same module under the same name.
CROSS_IMAGE_ENCODER_RULES = [
    (r"(encoder\.layers\.\d+\.(?:self_attn\.(?:in_proj_weight|in_proj_bias|out_proj\.weight|out_proj\.bias)"
     r"|(?:linear[12]|norm[12])\.(?:weight|bias)))", r"head.\1"),
]
SUPERVLAD_RULES = [(r"aggregation\.conv\.weight", "head.conv.weight"), *CROSS_IMAGE_ENCODER_RULES]


def convert_supervlad(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """Lu-Feng/SuperVLAD ``model_state_dict`` keys (``module.`` removed) -> ``supervlad*_dinov2_vitb14`` keys."""
    out = rename(state, SUPERVLAD_RULES + dinov2_rules("backbone."), what="SuperVLAD (Lu-Feng/SuperVLAD)")
    return adapt_dinov2_embeddings(out, model)


def _release(drive_id: str, filename: str, out_dim: int, recipe: str, **fields: Any) -> PretrainedCfg:
    return PretrainedCfg(
        download_page=f"https://drive.google.com/file/d/{drive_id}/view",
        filename=filename,
        remap=convert_supervlad,
        input_size=(3, DINOV2_EVAL_SIZE, DINOV2_EVAL_SIZE), interpolation="bicubic", out_dim=out_dim,
        recipe="Lu-Feng/SuperVLAD train.py --backbone=dino --freeze_te=8 --lr=0.00005 --epochs_num=20 "
               f"--patience=3 --train_batch_size=120 (GSV-Cities) {recipe}",
        license="MIT (Lu-Feng/SuperVLAD)",
        paper="SuperVLAD: Compact and Robust Image Descriptors for Visual Place Recognition (Lu et al., "
              "NeurIPS 2024)",
        code="https://github.com/Lu-Feng/SuperVLAD",
        **fields,
    )


pretrained_cfgs = {
    "supervladcross_dinov2_vitb14.official": _release(
        "1yomnWGTJko6nf3F2Ju6RWsLhP2EG82tL", "SuperVLAD.pth", 3072, "--supervlad_clusters=4 --crossimage_encoder",
        # ImAge's comparison table (REFERENCE.md section 5); Nordland = the 27,592-query +-10-frame protocol.
        metrics={"pitts30k_test/R@1": 95.0, "msls_val/R@1": 92.2, "msls_challenge/R@1": 75.3,
                 "tokyo247/R@1": 95.2, "nordland_10frames/R@1": 91.0},
        notes="Batch-dependent (cross-image encoder): figures are at the README's --infer_batch_size=8, "
              "322x322, queries and database in separate batches in file order.",
    ),
    "supervlad_dinov2_vitb14.official": _release(
        "1wRkUO4E8s5hNRNNIWcuA8RUvlGob3Tbf", "SuperVLAD_without_encoder.pth", 3072, "--supervlad_clusters=4",
        notes="README 'SuperVLAD without cross-image encoder'; the README gives no file name (the cache name "
              "is ours). No figure for this variant is recorded in REFERENCE.md.",
    ),
    "supervlad1_dinov2_vitb14.official": _release(
        "1pQcJx9n2-keAh9TttssZkz6D0vjpFWU6", "1-clusterVLAD.pth", 768, "--supervlad_clusters=1 --ghost_clusters=2",
        notes="README '1-cluster VLAD'. No figure for this variant is recorded in REFERENCE.md.",
    ),
}


@register_model
def supervlad_dinov2_vitb14(**kwargs: Any) -> nn.Module:
    """SuperVLAD (K = 4 centre-free clusters + 1 ghost) on DINOv2 ViT-B/14 patch tokens: 3072-D."""
    return vpr(DINOV2_VITB14, head(SuperVLAD), **kwargs)


@register_model
def supervladcross_dinov2_vitb14(**kwargs: Any) -> nn.Module:
    """SuperVLAD with the cross-image encoder (2 layers attending across the batch): 3072-D, batch-dependent."""
    return vpr(DINOV2_VITB14, head(SuperVLAD, cross_image=True), **kwargs)


@register_model
def supervlad1_dinov2_vitb14(**kwargs: Any) -> nn.Module:
    """1-cluster VLAD (K = 1 + 2 ghosts, no encoder) on DINOv2 ViT-B/14: 768-D, GeM-sized."""
    return vpr(DINOV2_VITB14, head(SuperVLAD, num_clusters=1, num_ghosts=2), **kwargs)
