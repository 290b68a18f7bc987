"""CricaVPR on DINOv2 ViT-B/14 with its multi-scale conv adapters, with the authors' released weights.

F. Lu, X. Lan, L. Zhang, D. Jiang, Y. Wang, C. Yuan, "CricaVPR: Cross-image Correlation-aware
Representation Learning for Visual Place Recognition", CVPR 2024, arXiv:2402.19231. Original code:
Lu-Feng/CricaVPR (MIT); names and shapes read from it, no code taken.

Upstream facts of ``CricaVPR.pth`` (Lu-Feng/CricaVPR @ f53e941, ``hubconf.py``, ``network.py``,
``backbone/dinov2/block.py``):

- ``hubconf.py`` wraps ``CricaVPRNet()`` in ``nn.DataParallel`` and loads the file's
  ``["model_state_dict"]``: every key starts with ``module.`` (unwrapped by the reader).
- ``self.backbone = vit_base(patch_size=14, img_size=518, init_values=1, block_chunks=0)``: DINOv2 hub
  names under ``backbone.`` (``pos_embed`` [1, 1370, 768], ``mask_token``, ``blocks.{i}.*``, ``norm``),
  DINOv2's position resampling (offset 0.1), plus ``backbone.blocks.{i}.adapter.{D_fc1, D_fc2,
  branch1.{conv,bn}, branch2.{0,1}.{conv,bn}, branch3.{0,1}.{conv,bn}}`` (batch norms with
  ``running_mean``, ``running_var``, ``num_batches_tracked``).
- ``self.aggregation = nn.Sequential(L2Norm(), GeM(), Flatten())`` -> ``aggregation.1.p`` [1];
  ``self.encoder`` = ``nn.TransformerEncoder(nn.TransformerEncoderLayer(768, 16, 2048, gelu,
  dropout 0.1, batch_first=False), 2)`` -> ``encoder.layers.{0,1}.*``.
- Evaluation at 224 x 224 (``parser.py --resize``), test batches of 16 (``--infer_batch_size``).
- ``test.py`` searches with ``faiss.IndexFlatL2``; ``eval.py --pca_dim 4096 --pca_dataset_folder
  pitts30k/images/train`` first fits ``util.compute_pca``: sklearn ``PCA(4096)`` (``whiten=False``) on the
  descriptors of at most 2^14 images of that folder (a shuffled loader), then ``pca.transform`` (centre,
  project; no whitening, no L2 before or after) of both sets. The cfg states both (``eval_metric="l2"``,
  ``eval_whitening_kind="project"``): ``eval.py model=cricavpr_dinov2_vitb14.official
  evaluation.postprocess.whitening_fit=<training images> evaluation.postprocess.whitening_dim=4096`` evaluates as upstream.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from aggzoo.hub.cfg import PretrainedCfg
from aggzoo.hub.registry import register_model
from aggzoo.hub.remap import rename
from aggzoo.models.backbones.multiconv_adapter import MultiConvAdapterViT
from aggzoo.models.heads.cricavpr import CricaVPR
from aggzoo.zoo._backbones import adapt_dinov2_embeddings, backbone, dinov2_rules, head, vpr
from aggzoo.zoo.supervlad import CROSS_IMAGE_ENCODER_RULES

__all__ = ["CRICAVPR_BACKBONE", "CRICAVPR_EVAL_SIZE", "convert_cricavpr", "cricavpr_dinov2_vitb14"]

#: The paper evaluates at 224 x 224 (a 16 x 16 patch map, the size its grid slices are written for).
CRICAVPR_EVAL_SIZE = 224

CRICAVPR_BACKBONE = backbone(
    "vit_base_patch14_dinov2", cls=MultiConvAdapterViT, adapter_scale=0.2, img_size=CRICAVPR_EVAL_SIZE,
    dynamic_img_size=True, pos_embed_resample="dinov2",
)

_RULES = [
    # Before the DINOv2 block rule, which would match these keys too.
    (r"backbone\.blocks\.(\d+)\.adapter\.(.+)", r"backbone.adapters.\1.\2"),
    (r"aggregation\.1\.p", "head.gem.p"),
    *CROSS_IMAGE_ENCODER_RULES,
]


def convert_cricavpr(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """``CricaVPR.pth`` keys (``module.`` removed) -> ``cricavpr_dinov2_vitb14`` keys."""
    out = rename(state, _RULES + dinov2_rules("backbone."), what="CricaVPR (Lu-Feng/CricaVPR)")
    return adapt_dinov2_embeddings(out, model)


pretrained_cfgs = {
    "cricavpr_dinov2_vitb14.official": PretrainedCfg(
        url="https://github.com/Lu-Feng/CricaVPR/releases/download/v1.0/CricaVPR.pth",
        download_page="https://drive.google.com/file/d/171lCcxZFFnvEvo88ntIwELeBegcMTEJs/view",
        filename="CricaVPR.pth",
        remap=convert_cricavpr,
        input_size=(3, CRICAVPR_EVAL_SIZE, CRICAVPR_EVAL_SIZE), interpolation="bicubic", out_dim=10752,
        eval_metric="l2", eval_whitening_kind="project",
        recipe="Lu-Feng/CricaVPR train.py (GSV-Cities, 224, frozen DINOv2 + adapters, Adam 1e-4, 10 epochs); "
               "conf/experiment/cricavpr_dinov2.yaml",
        license="MIT (Lu-Feng/CricaVPR)",
        paper="CricaVPR: Cross-image Correlation-aware Representation Learning for Visual Place Recognition "
              "(Lu et al., CVPR 2024), arXiv:2402.19231",
        code="https://github.com/Lu-Feng/CricaVPR",
        # ImAge's comparison table (REFERENCE.md section 5): after PCA to 4096; Nordland = +-10-frame protocol.
        metrics={"pitts30k_test/R@1": 94.9, "msls_val/R@1": 90.0, "msls_challenge/R@1": 69.0,
                 "tokyo247/R@1": 93.0, "nordland_10frames/R@1": 90.7},
        notes="Batch-dependent (cross-image encoder): figures at test batches of 16, queries and database apart, "
              "file order; they are after PCA to 4096 (sklearn, no whitening, no L2, fit on training images; "
              "L2-distance search). Shuffled test batches "
              "lower Pitts30k R@1 from 94.8 to ~92 (Lu-Feng/CricaVPR issue 7).",
    ),
}


@register_model
def cricavpr_dinov2_vitb14(**kwargs: Any) -> nn.Module:
    """CricaVPR: frozen DINOv2 ViT-B/14 with multi-scale conv adapters; CLS + 2x2 + 3x3 regional GeM through
    the cross-image encoder: 10752-D, batch-dependent."""
    return vpr(CRICAVPR_BACKBONE, head(CricaVPR), **kwargs)
