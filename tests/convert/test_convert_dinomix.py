"""DINO-Mix (GaoShuang98/DINO-Mix ``dinov2_vitb14_mix.ckpt``): the layout dumped from the authors' module
(layouts/dinov2_vitb14_mix.json) loads strictly and every tensor lands where it belongs.

The ViT is cut to 2 blocks to keep the test fast (block keys are renamed by index): the authors' keys of
blocks 2-11 are left out of the file, everything else is the released layout.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from official_layouts import assert_placed, authors_layout, fill, save

import aggzoo
from aggzoo.errors import StateDictMismatchError

DEPTH = 2
SMALL_VIT = {"depth": DEPTH, "frozen_stages": 0}


def _released_layout() -> list[tuple[str, tuple[int, ...]]]:
    shapes = authors_layout("dinov2_vitb14_mix")
    kept = [(k, s) for k, s in shapes if not (m := re.match(r"backbone\.dino_model\.blocks\.(\d+)\.", k))
            or int(m.group(1)) < DEPTH]
    assert len(shapes) - len(kept) == 14 * (12 - DEPTH)  # 14 tensors per DINOv2 block
    return kept


def test_dinomix_official_from_the_authors_layout(tmp_path: Path) -> None:
    upstream = fill(_released_layout())
    assert not any(".norm." in k for k in upstream)  # upstream replaced the final norm by an identity
    path = save({"state_dict": upstream}, tmp_path / "dinov2_vitb14_mix.ckpt")  # hubconf: state_dict['state_dict']
    model = aggzoo.create_model("dinomix_dinov2_vitb14.official", checkpoint_path=path, backbone_kwargs=SMALL_VIT)
    mapping = {k: None if k.endswith("mask_token")
               else k.replace("backbone.dino_model.", "backbone.model.").replace("aggregator.", "head.")
               for k in upstream}
    assert_placed(model, upstream, mapping)
    assert model.out_dim == 4096
    assert (model.head.in_h, model.head.in_w, len(model.head.mix)) == (16, 16, 2)


def test_dinomix_refuses_a_file_without_the_aggregator(tmp_path: Path) -> None:
    upstream = {k: v for k, v in fill(_released_layout()).items() if not k.startswith("aggregator.row_proj")}
    path = save({"state_dict": upstream}, tmp_path / "dinov2_vitb14_mix.ckpt")
    with pytest.raises(StateDictMismatchError, match="head.row_proj"):
        aggzoo.create_model("dinomix_dinov2_vitb14.official", checkpoint_path=path, backbone_kwargs=SMALL_VIT)


def test_dinomix_needs_224_inputs() -> None:
    model = aggzoo.create_model("dinomix_dinov2_vitb14", backbone_kwargs=SMALL_VIT).eval()
    with pytest.raises(ValueError, match="16x16"):
        model(torch.randn(1, 3, 322, 322))
