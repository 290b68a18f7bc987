"""SALAD and MegaLoc on DINOv2 ViT-B/14, with the authors' released weights."""

from __future__ import annotations

from typing import Any

from torch import nn

from aggzoo.convert.megaloc import convert_megaloc
from aggzoo.convert.salad import convert_salad
from aggzoo.pretrained import PretrainedCfg
from aggzoo.registry import register_model, register_pretrained
from aggzoo.zoo._specs import DINOV2_EVAL_SIZE, DINOV2_VITB14, head, vpr

__all__ = ["megaloc_dinov2_vitb14", "salad_dinov2_vitb14"]

_DINOV2_INPUT = (3, DINOV2_EVAL_SIZE, DINOV2_EVAL_SIZE)


@register_model
def salad_dinov2_vitb14(**kwargs: Any) -> nn.Module:
    """SALAD (m = 64 clusters of l = 128, g = 256) on DINOv2 ViT-B/14 with its final norm: 8448-D."""
    spec = head("salad.SALAD", num_clusters=64, cluster_dim=128, token_dim=256, dropout=0.3)
    return vpr(DINOV2_VITB14, spec, **kwargs)


@register_model
def megaloc_dinov2_vitb14(**kwargs: Any) -> nn.Module:
    """MegaLoc (SALAD with l = 256, then Linear 16640 -> 8448) on DINOv2 ViT-B/14: 8448-D."""
    spec = head("megaloc.MegaLoc", num_clusters=64, cluster_dim=256, token_dim=256, feat_dim=8448, dropout=0.3)
    return vpr(DINOV2_VITB14, spec, **kwargs)


register_pretrained("salad_dinov2_vitb14.official", PretrainedCfg(
    url="https://github.com/serizba/salad/releases/download/v1.0.0/dino_salad.ckpt",
    download_page="https://drive.google.com/file/d/1u83Dmqmm1-uikOPr58IIhfIzDYwFxCy1/view",
    filename="dino_salad.ckpt",
    remap=convert_salad,
    input_size=_DINOV2_INPUT, interpolation="bicubic", out_dim=8448,
    recipe="serizba/salad main.py: GSV-Cities, 224x224, 4 epochs, AdamW 6e-5, last 4 DINOv2 blocks trained",
    license="GPL-3.0 (serizba/salad)",
    paper="Optimal Transport Aggregation for Visual Place Recognition (Izquierdo & Civera, CVPR 2024), "
          "arXiv:2311.15937",
    code="https://github.com/serizba/salad",
    metrics={"msls_val/R@1": 92.2, "msls_challenge/R@1": 75.0, "nordland_1frame/R@1": 76.0, "sped/R@1": 92.1},
    notes="Evaluated at 322x322 (README eval.py --image_size 322 322).",
))

register_pretrained("megaloc_dinov2_vitb14.official", PretrainedCfg(
    hf_hub_id="gberton/MegaLoc", hf_hub_filename="model.safetensors",
    remap=convert_megaloc,
    input_size=_DINOV2_INPUT, interpolation="bicubic", out_dim=8448,
    recipe="gmberton/MegaLoc: trained on a mix of GSV-Cities, SF-XL, MSLS and more (see the paper)",
    license="MIT (gmberton/MegaLoc)",
    paper="MegaLoc: One Retrieval to Place Them All (Berton & Masone, CVPR Workshops 2025), arXiv:2502.17237",
    code="https://github.com/gmberton/MegaLoc",
    notes="Upstream rounds any input size to a multiple of 14 (antialiased resize); 322x322 recorded here. "
          "No published figure is recorded in REFERENCE.md.",
))
