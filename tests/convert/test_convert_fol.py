"""FoL's released checkpoints (``FoL_base.pth``, ``FoL_large.pth`` on the Hugging Face repo ``shunpeng/FoL``): the
layout dumped from the authors' own ``FoLNet`` (``layouts/FoL_*.json``) loads strictly through ``convert_fol`` and
every tensor lands where it belongs. The ViT keeps its first 2 blocks (block keys are renamed by index)."""

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
_BLOCK = re.compile(r"module\.backbone\.model\.blocks\.(\d+)\.")


def _upstream(layout: str) -> dict[str, torch.Tensor]:
    shapes = [(k, s) for k, s in authors_layout(layout) if not ((m := _BLOCK.match(k)) and int(m.group(1)) >= DEPTH)]
    return fill(shapes)


def _target(key: str) -> str | None:
    key = key.removeprefix("module.")
    if key == "backbone.model.mask_token":
        return None
    if key.startswith("backbone.model."):
        return key  # timm's DINOv2 keeps the hub names under backbone.model.
    if key.startswith("aggregator."):
        return "head." + key.removeprefix("aggregator.")
    return {"upconv.weight": "head.local_adapt.upconv1.weight", "upconv.bias": "head.local_adapt.upconv1.bias",
            "upconv2.weight": "head.local_adapt.upconv2.weight", "upconv2.bias": "head.local_adapt.upconv2.bias"}[key]


@pytest.mark.parametrize(("name", "layout", "channels", "side"), [
    ("fol_dinov2_vitb14.official", "FoL_base", 768, 322),
    ("fol_dinov2_vitl14.official", "FoL_large", 1024, 504),
])
def test_fol_official(tmp_path: Path, name: str, layout: str, channels: int, side: int) -> None:
    upstream = _upstream(layout)
    assert {k for k in upstream if not k.startswith("module.backbone.")} == {
        *(f"module.aggregator.{m}.{i}.{p}" for m, ids in (("token_features", (0, 2)), ("cluster_features", (0, 3)),
                                                          ("score", (0, 3))) for i in ids for p in ("weight", "bias")),
        *(f"module.{c}.{p}" for c in ("upconv", "upconv2") for p in ("weight", "bias"))}
    # train.py / util.save_checkpoint: {"model_state_dict": DataParallel(FoLNet).state_dict(), ...}
    path = save({"model_state_dict": upstream, "epoch_num": 7}, tmp_path / f"{layout}.pth")
    model = aggzoo.create_model(name, checkpoint_path=path, backbone_kwargs=SMALL_VIT)
    mapping = {key: _target(key) for key in upstream}
    # DINOv2's 37 x 37 position grid is kept (resampled per input size by DINOv2's rule).
    assert_placed(model, upstream, mapping)
    assert model.head.in_channels == channels and model.out_dim == 8448
    assert model.pretrained_cfg.input_size == (3, side, side)
    assert model.pretrained_cfg.hf_hub_id == "shunpeng/FoL" and model.pretrained_cfg.hf_hub_filename == f"{layout}.pth"


def test_the_other_backbone_is_refused(tmp_path: Path) -> None:
    path = save({"model_state_dict": _upstream("FoL_large")}, tmp_path / "FoL_large.pth")
    with pytest.raises(StateDictMismatchError):
        aggzoo.create_model("fol_dinov2_vitb14.official", checkpoint_path=path, backbone_kwargs=SMALL_VIT)
