"""NetVLAD on ResNet-50 conv4 (cut after layer3), with the deep-visual-geo-localization-benchmark weights."""

from __future__ import annotations

from typing import Any

from torch import nn

from aggzoo.convert.netvlad import convert_netvlad_benchmark
from aggzoo.pretrained import PretrainedCfg
from aggzoo.registry import register_model, register_pretrained
from aggzoo.zoo._specs import RESNET50_LAYER3, head, vpr

__all__ = ["netvlad_resnet50"]


@register_model
def netvlad_resnet50(**kwargs: Any) -> nn.Module:
    """NetVLAD (K = 64) on ResNet-50 conv4 (layer3, 1024 channels): 65536-D."""
    return vpr(RESNET50_LAYER3, head("netvlad.NetVLAD", num_clusters=64, normalize_input=True), **kwargs)


# tag -> (training set, Google Drive file id, published R@1 on Pitts30k-test / MSLS-val)
_RELEASES = {
    "official": ("MSLS", "1krf0A6CeW8GqLqHWZ7dlSNJ9aTJ4dotF", 80.9, 76.9),
    "official_pitts30k": ("Pitts30k", "1KL8HoAApOjJFETin7Q7u7IcsOvroKlSj", 86.0, 50.7),
}

for _tag, (_data, _drive_id, _pitts, _msls) in _RELEASES.items():
    register_pretrained(f"netvlad_resnet50.{_tag}", PretrainedCfg(
        download_page=f"https://drive.google.com/file/d/{_drive_id}/view",
        filename=f"resnet50conv4_netvlad_{_data.lower()}.pth",
        remap=convert_netvlad_benchmark,
        input_size=(3, 480, 640), interpolation="bilinear", out_dim=65536,
        recipe=f"gmberton/deep-visual-geo-localization-benchmark train.py --backbone=resnet50conv4 "
               f"--aggregation=netvlad on {_data}",
        license="MIT (gmberton/deep-visual-geo-localization-benchmark)",
        paper="Deep Visual Geo-localization Benchmark (Berton et al., CVPR 2022), arXiv:2204.03444",
        code="https://github.com/gmberton/deep-visual-geo-localization-benchmark",
        metrics={"pitts30k_test/R@1": _pitts, "msls_val/R@1": _msls},
        notes="README model zoo row 'resnet50-netvlad'; resnet50conv4 is the benchmark's ResNet cut for NetVLAD.",
    ))
