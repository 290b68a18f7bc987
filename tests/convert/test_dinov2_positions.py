"""Converted DINOv2 models equal the authors' at every input size (issue 12, item 2).

DINOv2 keeps its checkpoint's 37 x 37 position grid and resamples it once per input size
(``interpolate_pos_encoding``: bicubic, ``scale_factor = (g + 0.1) / 37``, no antialias). The reference
here is computed from the *upstream* tensors with ``F.interpolate`` directly
(:func:`official_layouts.dinov2_positions`), loaded into the same architecture built for exactly that
input size (so nothing is resampled in it), and compared with the converted model, which resamples
on the fly. Random weights (std 0.02, unit-std positions) at the paper configuration, ViT cut to 2 blocks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from official_layouts import (
    DINOV2_DIM,
    DINOV2_GRID,
    PATCH,
    Shapes,
    boq_aggregator,
    dinov2_hub,
    dinov2_positions,
    edtformer_layout,
    prefixed,
    salad_aggregator,
    save,
)
from torch import Tensor

import aggzoo
from aggzoo.errors import StateDictMismatchError
from aggzoo.hub.loading import load_into

DEPTH = 2
SIZES = [(224, 224), (322, 322), (238, 322)]  # the training size, the built size, a non-square one
TOLERANCE = 1e-5


def _data_parallel(state: dict[str, Tensor]) -> dict[str, Any]:
    return {"model_state_dict": {f"module.{k}": v for k, v in state.items()}}


@dataclass(frozen=True)
class Official:
    name: str
    shapes: Shapes
    prefix: str  # where the DINOv2 tensors sit upstream
    file: str
    wrap: Callable[[dict[str, Tensor]], Any] = dict
    backbone: dict[str, Any] = field(default_factory=lambda: {"depth": DEPTH, "frozen_stages": 0})
    overrides: dict[str, Any] = field(default_factory=dict)
    registers: bool = False


OFFICIAL = [
    Official("salad_dinov2_vitb14", prefixed("backbone.model.", dinov2_hub(DEPTH))
             + salad_aggregator("aggregator.", cluster_dim=128), "backbone.model.", "dino_salad.ckpt"),
    Official("megaloc_dinov2_vitb14", prefixed("backbone.", dinov2_hub(DEPTH, mask_token=False))
             + salad_aggregator("aggregator.agg.", cluster_dim=256)
             + [("aggregator.linear.weight", (64, 64 * 256 + 256)), ("aggregator.linear.bias", (64,))],
             "backbone.", "model.safetensors", overrides={"feat_dim": 64}),
    Official("boq_dinov2_vitb14", prefixed("backbone.dino.", dinov2_hub(DEPTH)) + boq_aggregator(384, DINOV2_DIM),
             "backbone.dino.", "dinov2_12288.pth"),
    Official("edtformer_dinov2_vitb14", edtformer_layout(DEPTH), "backbone.", "EDTformer.pth",
             wrap=_data_parallel, backbone={"depth": DEPTH}),
    Official("image_dinov2_vitb14_reg4", prefixed("backbone.", dinov2_hub(DEPTH, registers=4))
             + [("learnable_aggregation_tokens", (1, 8, DINOV2_DIM))], "backbone.", "ImAge_GSV.pth",
             wrap=_data_parallel, backbone={"depth": DEPTH, "insert_before_block": 1}, registers=True),
]


def _random(shapes: Shapes, seed: int = 0) -> dict[str, Tensor]:
    generator = torch.Generator().manual_seed(seed)
    out = {}
    for key, shape in shapes:
        value = torch.randn(shape, generator=generator)
        if key.endswith(("pos_embed", "cls_token", "register_tokens")):
            out[key] = value  # unit std: positions matter as much as image content
        elif "norm" in key and key.endswith(".weight"):  # LayerNorm scales
            out[key] = 1.0 + 0.02 * value
        else:
            out[key] = 0.02 * value
    return out


@pytest.fixture(scope="module", params=OFFICIAL, ids=[o.name for o in OFFICIAL])
def converted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    official: Official = request.param
    upstream = _random(official.shapes)
    path = save(official.wrap(upstream), tmp_path_factory.mktemp(official.name) / official.file)
    model = aggzoo.create_model(f"{official.name}.official", checkpoint_path=path,
                                backbone_kwargs=official.backbone, **official.overrides)
    return official, upstream, path, model


def _reference(official: Official, upstream: dict[str, Tensor], converted: torch.nn.Module,
               size: tuple[int, int]) -> torch.nn.Module:
    """The architecture built for exactly ``size`` (timm's rule: no resampling at the built grid),
    holding positions computed from the upstream 37 x 37 grid."""
    grid = (size[0] // PATCH, size[1] // PATCH)
    model = aggzoo.create_model(official.name, backbone_kwargs={**official.backbone, "img_size": size,
                                                                 "pos_embed_resample": "timm"}, **official.overrides)
    state = dict(converted.state_dict())
    pos, cls = upstream[official.prefix + "pos_embed"], upstream[official.prefix + "cls_token"]
    if official.registers:  # timm's no_embed_class: the class position travels with the class token
        state["backbone.model.pos_embed"] = dinov2_positions(pos, grid)[:, 1:]
        state["backbone.model.cls_token"] = cls + pos[:, :1]
    else:
        state["backbone.model.pos_embed"] = dinov2_positions(pos, grid)
    load_into(model, state)
    return model.eval()


def _images(size: tuple[int, int]) -> Tensor:
    return torch.rand(2, 3, *size, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("size", SIZES, ids=[f"{h}x{w}" for h, w in SIZES])
def test_official_dinov2_model_equals_the_authors_at_every_size(converted: tuple, size: tuple[int, int]) -> None:
    official, upstream, _, model = converted
    # The checkpoint's grid is kept, under the same key.
    assert model.backbone.pos_embed_grid == (DINOV2_GRID, DINOV2_GRID)
    positions = model.state_dict()["backbone.model.pos_embed"]
    assert positions.shape[1] == DINOV2_GRID**2 + (0 if official.registers else 1)
    reference = _reference(official, upstream, model, size)
    images = _images(size)
    with torch.no_grad():
        ours, theirs = model(images), reference(images)
    assert ours.shape == theirs.shape
    assert (ours - theirs).abs().max().item() <= TOLERANCE


def test_resampling_twice_is_what_differed(converted: tuple, tmp_path: Path) -> None:
    """The check above is sensitive: the former conversion (grid resampled to 23 x 23, then by timm to
    16 x 16) is off at 224 x 224 by far more than the tolerance."""
    official, upstream, path, _ = converted
    before = aggzoo.create_model(f"{official.name}.official", checkpoint_path=path, **official.overrides,
                                 backbone_kwargs={**official.backbone, "pos_embed_resample": "timm"})
    assert before.backbone.pos_embed_grid is None
    assert before.state_dict()["backbone.model.pos_embed"].shape[1] == 23 * 23 + (0 if official.registers else 1)
    reference = _reference(official, upstream, before, (224, 224))
    with torch.no_grad():
        gap = (before(_images((224, 224))) - reference(_images((224, 224)))).abs().max().item()
    assert gap > 10 * TOLERANCE


def test_a_converted_model_saved_and_loaded_keeps_the_grid(converted: tuple, tmp_path: Path) -> None:
    official, _, _, model = converted
    if official.name != "salad_dinov2_vitb14":
        pytest.skip("one method is enough for the file round trip")
    aggzoo.save_pretrained(model, tmp_path / "saved")
    loaded = aggzoo.create_model(f"local-dir:{tmp_path / 'saved'}")
    assert loaded.backbone.pos_embed_grid == (DINOV2_GRID, DINOV2_GRID)
    # torch's own load_state_dict (Lightning's resume) takes the 37 x 37 grid too, via the pre-hook.
    fresh = aggzoo.create_model(official.name, backbone_kwargs=official.backbone)
    assert fresh.backbone.pos_embed_grid == (23, 23)
    fresh.load_state_dict(model.state_dict())
    assert fresh.backbone.pos_embed_grid == (DINOV2_GRID, DINOV2_GRID)
    images = _images((224, 224))
    with torch.no_grad():
        expected = model(images)
        assert torch.equal(loaded(images), expected) and torch.equal(fresh.eval()(images), expected)


def test_a_checkpoint_written_before_still_loads(converted: tuple) -> None:
    """Files written before hold the 23 x 23 grid of 322-px inputs: they load into today's official
    architecture (the backbone keeps that grid) and give the same descriptors at 322 as before."""
    official, _, path, _ = converted
    if official.name not in ("salad_dinov2_vitb14", "image_dinov2_vitb14_reg4"):
        pytest.skip("a class-token model and a register model are enough")
    old = aggzoo.create_model(f"{official.name}.official", checkpoint_path=path, **official.overrides,
                              backbone_kwargs={**official.backbone, "pos_embed_resample": "timm"})
    new = aggzoo.create_model(official.name, backbone_kwargs=official.backbone, **official.overrides)
    load_into(new, old.state_dict())
    assert new.backbone.pos_embed_grid == (23, 23)
    images = _images((322, 322))
    with torch.no_grad():
        assert torch.equal(new.eval()(images), old(images))
        assert new(_images((224, 224))).isfinite().all()


def test_a_grid_that_is_not_square_is_refused_by_name() -> None:
    model = aggzoo.create_model("salad_dinov2_vitb14", backbone_kwargs={"depth": 1, "frozen_stages": 0})
    state = dict(model.state_dict())
    state["backbone.model.pos_embed"] = torch.zeros(1, 1 + 20 * 21, DINOV2_DIM)
    assert math.isqrt(20 * 21) ** 2 != 20 * 21
    with pytest.raises(StateDictMismatchError, match="backbone.model.pos_embed"):
        load_into(model, state)
