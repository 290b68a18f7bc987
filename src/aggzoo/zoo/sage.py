"""SAGE on DINOv2 ViT-L/14 and ViT-B/14 with power-recalibrated last blocks, with the authors' released weights.

S. Chen, C. Wang, R. Xu, X. Pei, Y. Song, J. Lin, W. Xu, J. Zhang, L. Guo, S. Xu, "SAGE: Spatial-visual
Adaptive Graph Exploration for Efficient Visual Place Recognition", ICLR 2026, arXiv:2509.25723. Original
code: chenshunpeng/SAGE (MIT; evaluation code only, the training code is not released); names and shapes
read from it, no code taken.

Upstream facts of the released files (chenshunpeng/SAGE @ dc79e21, ``network.py``, ``eval.py``,
``backbone/dinov2_sage.py``, ``aggregators/SAGE.py``, ``config.py``, ``test.py``, ``util.py``, README):

- ``network.SAGE``: ``self.backbone = DINOv2('dinov2_vitl14', norm_layer=True, num_recalib_blocks=4,
  num_trainable_blocks=0, recalibration='dpn_s1', return_token=True)`` holding the torch.hub DINOv2 as
  ``backbone.model`` (hub names: ``cls_token``, ``pos_embed`` [1, 1370, C], ``mask_token``, ``blocks.{i}``,
  ``norm``; position resampling with offset 0.1) and ``backbone.gpn_norms.{0..3}.projection.{0,3}``
  (``DPN(C)``, hidden 16) after blocks 20..23 (8..11 on ViT-B); ``self.aggregator = SoftP(...)`` with
  ``aggregator.{soft_weighting.predictor.{0,2}, token_features.{0,2}, cluster_features.{0,3},
  score.{0,3}, single_branch.{0,3}, gpn.projection.{0,3}}``; with ``--crossimage_encoder``,
  ``self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(768, 16, 1024, gelu, dropout 0.1,
  batch_first=False), 2)``. ``single_branch`` is never read by the forward (``bilinear=True``): dropped.
  The ViT-B files come from the same module with the commented ``dinov2_vitb14`` / ``num_channels=768``
  lines of ``network.py``.
- ``eval.py`` loads ``torch.load(...)['model_state_dict']``, strips a leading ``module.`` when present
  (the reader does the same) and loads with ``strict=False``.
- Evaluation (``config.py``): 322 x 322 for every dataset; ImageNet mean/std, then
  ``transforms.functional.resize`` of the normalised tensor (bilinear, torchvision 0.16: no antialias);
  ``faiss.IndexFlatL2`` search. With the encoder, test batches per dataset: 2 (SPED, AmsterTime),
  16 (MSLS-val, Tokyo), 20 (Eynsham), 26 (Nordland), 8 otherwise, database and queries apart, in file
  order; the encoder output is searched as it is (not unit-norm). Without it: batches of 64.
- PCA (README "To add PCA": ``eval.py --pca_dim=4096 --pca_dataset_folder=msls/images/train``):
  ``util.compute_pca`` fits sklearn ``PCA(4096)`` (no whitening) on the descriptors of at most 2^14
  images of MSLS train and ``test.py`` applies ``pca.transform`` (centre, project; no L2) to both sets.
  The PCA is not in the released files (it is fitted and cached locally), so it is not a layer of the
  model here: ``eval.py model=<name> evaluation.postprocess.whitening_fit=<MSLS train images>
  evaluation.postprocess.whitening_dim=4096`` does the same (the cfgs state ``eval_whitening_kind="project"``
  and ``eval_metric="l2"``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from aggzoo.hub.cfg import PretrainedCfg
from aggzoo.hub.registry import register_model
from aggzoo.hub.remap import rename
from aggzoo.models.backbones.power_recalibration import PowerRecalibratedViT
from aggzoo.models.heads.sage import SAGE
from aggzoo.zoo._backbones import DINOV2_EVAL_SIZE, adapt_dinov2_embeddings, backbone, dinov2_rules, head, vpr
from aggzoo.zoo.supervlad import CROSS_IMAGE_ENCODER_RULES

__all__ = [
    "SAGE_DINOV2_VITB14",
    "SAGE_DINOV2_VITL14",
    "SAGE_RULES",
    "convert_sage",
    "sage_dinov2_vitb14",
    "sage_dinov2_vitl14",
    "sagecross_dinov2_vitl14",
]


def _sage_backbone(model_name: str) -> dict[str, Any]:
    return backbone(model_name, cls=PowerRecalibratedViT, img_size=DINOV2_EVAL_SIZE, dynamic_img_size=True,
                    pos_embed_resample="dinov2")


#: DINOv2 ViT-L/14 (the paper's) and ViT-B/14, frozen except the final norm, a power norm after the last 4 blocks.
SAGE_DINOV2_VITL14 = _sage_backbone("vit_large_patch14_dinov2")
SAGE_DINOV2_VITB14 = _sage_backbone("vit_base_patch14_dinov2")

SAGE_RULES = [
    (r"backbone\.gpn_norms\.(\d+)\.(projection\.[03]\.(?:weight|bias))", r"backbone.recalibrations.\1.\2"),
    # The bilinear=False branch of SoftP: built and trained-free, never read by the forward.
    (r"aggregator\.single_branch\.[03]\.(?:weight|bias)", None),
    (r"aggregator\.((?:soft_weighting\.predictor\.[02]|token_features\.[02]|cluster_features\.[03]|score\.[03]"
     r"|gpn\.projection\.[03])\.(?:weight|bias))", r"head.\1"),
    *CROSS_IMAGE_ENCODER_RULES,
]


def convert_sage(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """chenshunpeng/SAGE ``model_state_dict`` keys (``module.`` removed) -> ``sage*_dinov2_*`` keys."""
    out = rename(state, SAGE_RULES + dinov2_rules("backbone.model."), what="SAGE (chenshunpeng/SAGE)")
    return adapt_dinov2_embeddings(out, model)


_FOLDER = "https://drive.google.com/drive/folders/1-nQi9fhJPuiqHkcrGqBoIwiemnQ2L1-m"


def _figures(**recalls: tuple[float, float, float]) -> dict[str, float]:
    """``pitts30k_test=(R@1, R@5, R@10)`` as the README's rows -> ``{"pitts30k_test/R@1": ...}`` (the zoo
    records R@1; R@5 and R@10 stay written here, beside them, as the README gives them)."""
    return {f"{name}/R@1": row[0] for name, row in recalls.items()}


def _release(drive_id: str, filename: str, size: str, metrics: Mapping[str, float], table: str,
             *, cross_image: bool) -> PretrainedCfg:
    batches = ("Batch-dependent (cross-image encoder): figures at the README's per-dataset test batches (2 SPED and "
               "AmsterTime, 16 MSLS-val and Tokyo, 20 Eynsham, 26 Nordland, 8 otherwise; config.py), database and "
               "queries apart, file order; the encoder output is searched unnormalised by L2 distance"
               if cross_image else "Test batches of 64; unit-norm 8448-D descriptors searched by L2 distance")
    return PretrainedCfg(
        download_page=f"https://drive.google.com/file/d/{drive_id}/view",
        filename=filename,
        remap=convert_sage,
        input_size=(3, DINOV2_EVAL_SIZE, DINOV2_EVAL_SIZE), interpolation="bilinear", out_dim=8448,
        eval_metric="l2", eval_whitening_kind="project",
        recipe=f"chenshunpeng/SAGE (training code not released): frozen DINOv2 {size} + 4 power norms + final norm "
               "+ SoftP" + (" + cross-image encoder" if cross_image else "") + " trained; README: eval.py"
               + (" --crossimage_encoder" if cross_image else ""),
        license="MIT (chenshunpeng/SAGE)",
        paper="SAGE: Spatial-visual Adaptive Graph Exploration for Efficient Visual Place Recognition (Chen et al., "
              "ICLR 2026), arXiv:2509.25723",
        code="https://github.com/chenshunpeng/SAGE",
        metrics=metrics,
        notes=(f"Figures: the authors' README, table '{table}' (Nordland** = nordland_10frames, Nordland* = "
               f"nordland_1frame). {batches}. Upstream resizes the normalised tensor (bilinear, no "
               "antialias); aggzoo's protocol resize antialiases. Optional PCA to 4096 (fit on MSLS train, not in "
               f"the file): evaluation.postprocess.whitening_dim=4096. All files: {_FOLDER}. "
               "The README does not say whether its tables are after PCA; the paper's abstract reports SPED R@1 "
               "98.9 and R@10 100% 'only using 4096D global descriptors'."),
    )


pretrained_cfgs = {
    "sagecross_dinov2_vitl14.official": _release(
        "1oybKqxFYIHYwoA9HuG7tlaCif7DcJsd4", "SAGE.pth", "ViT-L/14",
        _figures(pitts30k_test=(95.8, 97.8, 98.4), msls_val=(94.5, 97.4, 97.8), nordland_10frames=(96.0, 98.9, 99.4),
                 tokyo247=(97.5, 99.0, 99.4), sped=(98.8, 99.7, 100.0), pitts250k_test=(98.4, 99.4, 99.6),
                 eynsham=(93.1, 96.2, 97.0), amstertime=(83.5, 93.3, 95.4)),
        "Results at 322x322 (with cross-image encoder)", cross_image=True),
    "sage_dinov2_vitl14.official": _release(
        "1dML3VyYBixH4ZzNfoJavhKbS1b7hvif9", "SAGE_ViT-L.pth", "ViT-L/14",
        _figures(pitts30k_test=(94.7, 97.7, 98.4), msls_val=(94.2, 97.8, 98.1), nordland_10frames=(94.8, 98.2, 98.9),
                 tokyo247=(98.1, 98.1, 98.7), sped=(92.1, 96.2, 96.9), pitts250k_test=(96.9, 99.2, 99.6),
                 nordland_1frame=(87.4, 96.2, 97.5), eynsham=(92.3, 95.9, 96.7), sf_xl_small=(89.0, 91.8, 92.2),
                 amstertime=(65.6, 86.7, 90.4)),
        "Results at 322x322 (without cross-image encoder), ViT-L", cross_image=False),
    "sage_dinov2_vitb14.official": _release(
        "1P4NrddzJ9nWo9Wdan3uDi6zS6E-ub2y6", "SAGE_ViT-B.pth", "ViT-B/14",
        _figures(pitts30k_test=(93.4, 97.0, 97.9), msls_val=(93.4, 97.3, 97.6), nordland_10frames=(94.1, 98.0, 98.8),
                 tokyo247=(97.1, 98.4, 99.0), sped=(91.8, 95.7, 96.5), pitts250k_test=(95.7, 98.6, 99.2),
                 nordland_1frame=(86.7, 95.9, 97.0), eynsham=(92.3, 95.8, 96.5), sf_xl_small=(88.8, 90.5, 90.9),
                 amstertime=(63.1, 82.5, 86.2)),
        "Results at 322x322 (without cross-image encoder), ViT-B", cross_image=False),
}


@register_model
def sagecross_dinov2_vitl14(**kwargs: Any) -> nn.Module:
    """SAGE, the authors' best model: frozen DINOv2 ViT-L/14 with power-recalibrated last 4 blocks, soft-probing
    bilinear aggregation (64 x 128 + 256) and the cross-image encoder: 8448-D, batch-dependent, not unit-norm."""
    return vpr(SAGE_DINOV2_VITL14, head(SAGE, cross_image=True), **kwargs)


@register_model
def sage_dinov2_vitl14(**kwargs: Any) -> nn.Module:
    """SAGE without the cross-image encoder on DINOv2 ViT-L/14 (power-recalibrated last 4 blocks): 8448-D."""
    return vpr(SAGE_DINOV2_VITL14, head(SAGE), **kwargs)


@register_model
def sage_dinov2_vitb14(**kwargs: Any) -> nn.Module:
    """SAGE without the cross-image encoder on DINOv2 ViT-B/14 (power-recalibrated last 4 blocks): 8448-D."""
    return vpr(SAGE_DINOV2_VITB14, head(SAGE), **kwargs)
