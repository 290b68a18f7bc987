"""Official DINOv2-based checkpoints (SALAD, MegaLoc, BoQ-DINOv2, ImAge, QAA): a file with the upstream
key names and shapes loads strictly and every tensor lands where it belongs.

The position embedding keeps the checkpoint's 37 x 37 grid (the backbones resample it per input size
by DINOv2's rule: tests/convert/test_dinov2_positions.py). The ViT is cut to 2 blocks to keep the test fast (block keys are renamed by index, so 2 blocks
exercise the same rules as 12); everything else is at the paper configuration, except MegaLoc's
final Linear, shrunk from 8448 outputs to 64 (a 140M-value matrix otherwise).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from official_layouts import (
    DINOV2_DIM,
    assert_placed,
    authors_layout,
    boq_aggregator,
    dinov2_hub,
    edtformer_layout,
    fill,
    prefixed,
    qaa_aggregator,
    salad_aggregator,
    save,
)

import aggzoo
from aggzoo.errors import StateDictMismatchError

DEPTH = 2
SMALL_VIT = {"depth": DEPTH, "frozen_stages": 0}
C = DINOV2_DIM


def test_salad_official(tmp_path: Path) -> None:
    upstream = fill(prefixed("backbone.model.", dinov2_hub(DEPTH)) + salad_aggregator("aggregator.", cluster_dim=128))
    path = save(upstream, tmp_path / "dino_salad.ckpt")  # hubconf.py: a raw state dict
    model = aggzoo.create_model("salad_dinov2_vitb14.official", checkpoint_path=path, backbone_kwargs=SMALL_VIT)
    mapping = {k: None if k.endswith("mask_token") else k.replace("aggregator.", "head.") for k in upstream}
    transformed = {"backbone.model.pos_embed": upstream["backbone.model.pos_embed"]}
    assert_placed(model, upstream, mapping, transformed)
    assert model.out_dim == 8448


def test_salad_checkpoint_with_an_unknown_key_is_refused(tmp_path: Path) -> None:
    upstream = fill(prefixed("backbone.model.", dinov2_hub(DEPTH)) + salad_aggregator("aggregator.", cluster_dim=128))
    upstream["aggregator.extra_layer.weight"] = torch.zeros(3)
    path = save(upstream, tmp_path / "dino_salad.ckpt")
    with pytest.raises(StateDictMismatchError, match="aggregator.extra_layer.weight"):
        aggzoo.create_model("salad_dinov2_vitb14.official", checkpoint_path=path, backbone_kwargs=SMALL_VIT)
    del upstream["aggregator.extra_layer.weight"], upstream["aggregator.dust_bin"]
    save(upstream, path)
    with pytest.raises(StateDictMismatchError, match="head.dust_bin"):
        aggzoo.create_model("salad_dinov2_vitb14.official", checkpoint_path=path, backbone_kwargs=SMALL_VIT)


def test_megaloc_official(tmp_path: Path) -> None:
    feat_dim = 64  # paper: 8448
    shapes = (prefixed("backbone.", dinov2_hub(DEPTH, mask_token=False))
              + salad_aggregator("aggregator.agg.", cluster_dim=256)
              + [("aggregator.linear.weight", (feat_dim, 64 * 256 + 256)), ("aggregator.linear.bias", (feat_dim,))])
    upstream = fill(shapes)
    path = save(upstream, tmp_path / "model.safetensors")  # Hugging Face gberton/MegaLoc
    model = aggzoo.create_model("megaloc_dinov2_vitb14.official", checkpoint_path=path, backbone_kwargs=SMALL_VIT,
                                feat_dim=feat_dim)
    mapping = {k: k.replace("aggregator.", "head.", 1).replace("backbone.", "backbone.model.", 1) for k in upstream}
    transformed = {"backbone.model.pos_embed": upstream["backbone.pos_embed"]}
    assert_placed(model, upstream, mapping, transformed)


def _qaa_release_layout() -> list[tuple[str, tuple[int, ...]]]:
    """layouts/QAA-8192.json (dumped from the port's QAA module) without the ViT blocks from DEPTH on."""
    shapes = authors_layout("QAA-8192")
    kept = [(k, s) for k, s in shapes
            if not (m := re.match(r"backbone\.model\.blocks\.(\d+)\.", k)) or int(m.group(1)) < DEPTH]
    assert len(shapes) - len(kept) == 14 * (12 - DEPTH)
    # the layout written from the port's source agrees with the dumped one
    assert sorted(kept) == sorted(prefixed("backbone.model.", dinov2_hub(DEPTH)) + qaa_aggregator("aggregator."))
    return kept


def test_qaa_official_drops_the_tensors_its_forward_never_reads(tmp_path: Path) -> None:
    upstream = fill(_qaa_release_layout())
    path = save(upstream, tmp_path / "model.safetensors")  # Hugging Face xjh19971/QAA-8192
    model = aggzoo.create_model("qaa_dinov2_vitb14.official", checkpoint_path=path, backbone_kwargs=SMALL_VIT)
    unused = {"backbone.model.mask_token", "backbone.model.norm.weight", "backbone.model.norm.bias",
              "aggregator.dust_bin", "aggregator.score.norm2_out.weight", "aggregator.score.norm2_out.bias"}
    assert unused <= set(upstream) and sum(upstream[k].numel() for k in unused if "aggregator" in k) == 129
    mapping = {k: None if k in unused else k.replace("aggregator.", "head.") for k in upstream}
    transformed = {"backbone.model.pos_embed": upstream["backbone.model.pos_embed"]}
    assert_placed(model, upstream, mapping, transformed)
    assert model.out_dim == 8192 and not any(k.startswith("backbone.model.norm.") for k in model.state_dict())
    assert not model.head.sinkhorn  # the release's configuration (aggzoo.zoo.qaa): no score normalisation


def test_qaa_weights_with_the_authors_score_normalisation_keep_the_dustbin(tmp_path: Path) -> None:
    upstream = fill(_qaa_release_layout())
    path = save(upstream, tmp_path / "model.safetensors")
    model = aggzoo.create_model("qaa_dinov2_vitb14.official", checkpoint_path=path, backbone_kwargs=SMALL_VIT,
                                sinkhorn=True)
    unused = {"backbone.model.mask_token", "backbone.model.norm.weight", "backbone.model.norm.bias",
              "aggregator.score.norm2_out.weight", "aggregator.score.norm2_out.bias"}
    mapping = {k: None if k in unused else k.replace("aggregator.", "head.") for k in upstream}
    assert mapping["aggregator.dust_bin"] == "head.dust_bin"
    transformed = {"backbone.model.pos_embed": upstream["backbone.model.pos_embed"]}
    assert_placed(model, upstream, mapping, transformed)
    assert model.head.sinkhorn


def test_boq_dinov2_official_drops_the_unused_final_norm(tmp_path: Path) -> None:
    upstream = fill(prefixed("backbone.dino.", dinov2_hub(DEPTH)) + boq_aggregator(384, C))
    path = save(upstream, tmp_path / "dinov2_12288.pth")
    model = aggzoo.create_model("boq_dinov2_vitb14.official", checkpoint_path=path,
                                backbone_kwargs={**SMALL_VIT})
    dropped = {"backbone.dino.mask_token", "backbone.dino.norm.weight", "backbone.dino.norm.bias"}
    assert dropped <= set(upstream)
    mapping = {k: None if k in dropped else k.replace("backbone.dino.", "backbone.model.").replace("aggregator.", "head.")
               for k in upstream}
    transformed = {"backbone.model.pos_embed": upstream["backbone.dino.pos_embed"]}
    assert_placed(model, upstream, mapping, transformed)
    assert model.out_dim == 12288 and not any(k.startswith("backbone.model.norm.") for k in model.state_dict())


def test_image_official_with_registers_and_data_parallel_prefix(tmp_path: Path) -> None:
    shapes = prefixed("backbone.", dinov2_hub(DEPTH, registers=4)) + [("learnable_aggregation_tokens", (1, 8, C))]
    upstream = fill(shapes)
    # hubconf.py: torch.nn.DataParallel(model).load_state_dict(torch.load(...)["model_state_dict"])
    checkpoint = {"model_state_dict": {f"module.{k}": v for k, v in upstream.items()}, "epoch_num": 7}
    path = save(checkpoint, tmp_path / "ImAge_GSV.pth")
    model = aggzoo.create_model("image_dinov2_vitb14_reg4.official", checkpoint_path=path,
                                backbone_kwargs={"depth": DEPTH, "insert_before_block": 1})
    mapping = {k: k.replace("backbone.", "backbone.model.", 1) for k in upstream}
    mapping["backbone.mask_token"] = None
    mapping["backbone.register_tokens"] = "backbone.model.reg_token"
    mapping["learnable_aggregation_tokens"] = "backbone.aggregation_tokens"
    pos = upstream["backbone.pos_embed"]
    # timm's register models keep the class position in the class token (no_embed_class).
    transformed = {"backbone.model.cls_token": upstream["backbone.cls_token"] + pos[:, :1],
                   "backbone.model.pos_embed": pos[:, 1:]}
    assert_placed(model, upstream, mapping, transformed)
    assert model.out_dim == 6144


def test_edtformer_official_with_lopa_adapters(tmp_path: Path) -> None:
    shapes = edtformer_layout(DEPTH)
    upstream = fill(shapes)
    # hubconf.py: torch.nn.DataParallel(VPRNet()).load_state_dict(torch.load(...)["model_state_dict"])
    checkpoint = {"model_state_dict": {f"module.{k}": v for k, v in upstream.items()}, "epoch_num": 15}
    path = save(checkpoint, tmp_path / "EDTformer.pth")
    model = aggzoo.create_model("edtformer_dinov2_vitb14.official", checkpoint_path=path,
                                backbone_kwargs={"depth": DEPTH})
    mapping: dict[str, str | None] = {}
    for key in upstream:
        if key.startswith("backbone.adapters."):
            mapping[key] = key.replace(".D_fc", ".fc")
        elif key.startswith("backbone."):
            mapping[key] = key.replace("backbone.", "backbone.model.", 1)
        else:
            mapping[key] = "head." + key
    mapping["backbone.mask_token"] = None
    transformed = {"backbone.model.pos_embed": upstream["backbone.pos_embed"]}
    assert_placed(model, upstream, mapping, transformed)
    assert model.out_dim == 4096
    with torch.no_grad():
        assert model.eval()(torch.rand(1, 3, 322, 322)).shape == (1, 4096)
