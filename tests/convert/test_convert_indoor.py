"""Indoor-VPR (Enrico-Chiavassa/Indoor-VPR) releases: EigenPlaces-indoor and SALAD-indoor files, whose layouts
were dumped from the authors' ``model/network.py`` modules (layouts/<file>.json: the torch.hub EigenPlaces / SALAD
model under ``model.``), load strictly into the existing architectures and every tensor lands where it belongs.

The SALAD ViT is cut to 2 blocks to keep the test fast (block keys are renamed by index): the authors' keys of
blocks 2-11 are left out of the file.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from official_layouts import assert_placed, authors_layout, fill, save

import aggzoo
from aggzoo.errors import StateDictMismatchError

DEPTH = 2
SMALL_VIT = {"depth": DEPTH, "frozen_stages": 0}
# torchvision ResNet.children() indices of the upstream nn.Sequential backbone
RESNET_CHILDREN = {"0": "conv1", "1": "bn1", "4": "layer1", "5": "layer2", "6": "layer3", "7": "layer4"}


def _eigenplaces_target(key: str) -> str:
    inner = key.removeprefix("model.")
    if inner.startswith("aggregation."):
        return "head." + inner
    index, _, rest = inner.removeprefix("backbone.").partition(".")
    return f"backbone.model.{RESNET_CHILDREN[index]}.{rest}"


@pytest.mark.parametrize("tag", ["indoor", "indoor_gb1_bai_10_25_s"])
def test_eigenplaces_indoor_from_the_authors_layout(tmp_path: Path, tag: str) -> None:
    upstream = fill(authors_layout("eigenplaces_ResNet50_2048_GB1_BAI_5_10"))  # both variations: one module
    assert all(k.startswith("model.") for k in upstream)
    path = save(upstream, tmp_path / "eigenplaces_indoor.pth")  # hubconf: a raw state dict, loaded strictly
    model = aggzoo.create_model(f"eigenplaces_resnet50.{tag}", checkpoint_path=path)
    assert_placed(model, upstream, {k: _eigenplaces_target(k) for k in upstream})
    assert model.out_dim == 2048


def _salad_layout() -> list[tuple[str, tuple[int, ...]]]:
    shapes = authors_layout("salad_Dinov2_8448_GB1_10_25")
    kept = [(k, s) for k, s in shapes
            if not (m := re.match(r"model\.backbone\.model\.blocks\.(\d+)\.", k)) or int(m.group(1)) < DEPTH]
    assert len(shapes) - len(kept) == 14 * (12 - DEPTH)
    return kept


@pytest.mark.parametrize("tag", ["indoor", "indoor_hb1_gb1_2_5"])
def test_salad_indoor_from_the_authors_layout(tmp_path: Path, tag: str) -> None:
    upstream = fill(_salad_layout())
    path = save(upstream, tmp_path / "salad_indoor.pth")
    model = aggzoo.create_model(f"salad_dinov2_vitb14.{tag}", checkpoint_path=path, backbone_kwargs=SMALL_VIT)
    mapping = {k: None if k.endswith("mask_token") else k.removeprefix("model.").replace("aggregator.", "head.")
               for k in upstream}
    assert_placed(model, upstream, mapping)
    assert model.out_dim == 8448


def test_salad_indoor_file_missing_the_dustbin_is_refused(tmp_path: Path) -> None:
    upstream = {k: v for k, v in fill(_salad_layout()).items() if not k.endswith("dust_bin")}
    path = save(upstream, tmp_path / "salad_indoor.pth")
    with pytest.raises(StateDictMismatchError, match="head.dust_bin"):
        aggzoo.create_model("salad_dinov2_vitb14.indoor", checkpoint_path=path, backbone_kwargs=SMALL_VIT)
