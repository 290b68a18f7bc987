"""Official DINOv2-based checkpoints (SALAD, MegaLoc, BoQ-DINOv2, ImAge): a file with the upstream
key names and shapes loads strictly and every tensor lands where it belongs.

The ViT is cut to 2 blocks to keep the test fast (block keys are renamed by index, so 2 blocks
exercise the same rules as 12); everything else is at the paper configuration, except MegaLoc's
final Linear, shrunk from 8448 outputs to 64 (a 140M-value matrix otherwise).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from official_layouts import (
    DINOV2_DIM,
    assert_placed,
    dinov2_hub,
    dinov2_resampled,
    fill,
    multihead_attention,
    prefixed,
    save,
)

import aggzoo
from aggzoo.errors import StateDictMismatchError

DEPTH = 2
GRID = 23  # 322 / 14
SMALL_VIT = {"depth": DEPTH, "frozen_stages": 0}
C = DINOV2_DIM


def _salad_aggregator(prefix: str, *, cluster_dim: int) -> list:
    return prefixed(prefix, [
        ("token_features.0.weight", (512, C)), ("token_features.0.bias", (512,)),
        ("token_features.2.weight", (256, 512)), ("token_features.2.bias", (256,)),
        ("cluster_features.0.weight", (512, C, 1, 1)), ("cluster_features.0.bias", (512,)),
        ("cluster_features.3.weight", (cluster_dim, 512, 1, 1)), ("cluster_features.3.bias", (cluster_dim,)),
        ("score.0.weight", (512, C, 1, 1)), ("score.0.bias", (512,)),
        ("score.3.weight", (64, 512, 1, 1)), ("score.3.bias", (64,)),
        ("dust_bin", ()),
    ])


def _boq_aggregator(p: int, in_channels: int, *, queries: int = 64, layers: int = 2, rows: int = 32) -> list:
    shapes = [("proj_c.weight", (p, in_channels, 3, 3)), ("proj_c.bias", (p,)),
              ("norm_input.weight", (p,)), ("norm_input.bias", (p,))]
    for i in range(layers):
        b = f"boqs.{i}."
        shapes += multihead_attention(b + "encoder.self_attn.", p)
        shapes += [(b + "encoder.linear1.weight", (4 * p, p)), (b + "encoder.linear1.bias", (4 * p,)),
                   (b + "encoder.linear2.weight", (p, 4 * p)), (b + "encoder.linear2.bias", (p,)),
                   (b + "encoder.norm1.weight", (p,)), (b + "encoder.norm1.bias", (p,)),
                   (b + "encoder.norm2.weight", (p,)), (b + "encoder.norm2.bias", (p,)),
                   (b + "queries", (1, queries, p))]
        shapes += multihead_attention(b + "self_attn.", p)
        shapes += [(b + "norm_q.weight", (p,)), (b + "norm_q.bias", (p,))]
        shapes += multihead_attention(b + "cross_attn.", p)
        shapes += [(b + "norm_out.weight", (p,)), (b + "norm_out.bias", (p,))]
    shapes += [("fc.weight", (rows, layers * queries)), ("fc.bias", (rows,))]
    return prefixed("aggregator.", shapes)


def test_salad_official(tmp_path: Path) -> None:
    upstream = fill(prefixed("backbone.model.", dinov2_hub(DEPTH)) + _salad_aggregator("aggregator.", cluster_dim=128))
    path = save(upstream, tmp_path / "dino_salad.ckpt")  # hubconf.py: a raw state dict
    model = aggzoo.create_model("salad_dinov2_vitb14.official", checkpoint_path=path, backbone_kwargs=SMALL_VIT)
    mapping = {k: None if k.endswith("mask_token") else k.replace("aggregator.", "head.") for k in upstream}
    transformed = {"backbone.model.pos_embed": dinov2_resampled(upstream["backbone.model.pos_embed"], GRID)}
    assert_placed(model, upstream, mapping, transformed)
    assert model.out_dim == 8448


def test_salad_checkpoint_with_an_unknown_key_is_refused(tmp_path: Path) -> None:
    upstream = fill(prefixed("backbone.model.", dinov2_hub(DEPTH)) + _salad_aggregator("aggregator.", cluster_dim=128))
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
              + _salad_aggregator("aggregator.agg.", cluster_dim=256)
              + [("aggregator.linear.weight", (feat_dim, 64 * 256 + 256)), ("aggregator.linear.bias", (feat_dim,))])
    upstream = fill(shapes)
    path = save(upstream, tmp_path / "model.safetensors")  # Hugging Face gberton/MegaLoc
    model = aggzoo.create_model("megaloc_dinov2_vitb14.official", checkpoint_path=path, backbone_kwargs=SMALL_VIT,
                                feat_dim=feat_dim)
    mapping = {k: k.replace("aggregator.", "head.", 1).replace("backbone.", "backbone.model.", 1) for k in upstream}
    transformed = {"backbone.model.pos_embed": dinov2_resampled(upstream["backbone.pos_embed"], GRID)}
    assert_placed(model, upstream, mapping, transformed)


def test_boq_dinov2_official_drops_the_unused_final_norm(tmp_path: Path) -> None:
    upstream = fill(prefixed("backbone.dino.", dinov2_hub(DEPTH)) + _boq_aggregator(384, C))
    path = save(upstream, tmp_path / "dinov2_12288.pth")
    model = aggzoo.create_model("boq_dinov2_vitb14.official", checkpoint_path=path,
                                backbone_kwargs={**SMALL_VIT})
    dropped = {"backbone.dino.mask_token", "backbone.dino.norm.weight", "backbone.dino.norm.bias"}
    assert dropped <= set(upstream)
    mapping = {k: None if k in dropped else k.replace("backbone.dino.", "backbone.model.").replace("aggregator.", "head.")
               for k in upstream}
    transformed = {"backbone.model.pos_embed": dinov2_resampled(upstream["backbone.dino.pos_embed"], GRID)}
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
                   "backbone.model.pos_embed": dinov2_resampled(pos, GRID)[:, 1:]}
    assert_placed(model, upstream, mapping, transformed)
    assert model.out_dim == 6144


def test_edtformer_official_with_lopa_adapters(tmp_path: Path) -> None:
    shapes = prefixed("backbone.", dinov2_hub(DEPTH))
    for i in range(DEPTH):  # LoPA (backbone/LadderAdapter.py): Linear 768 -> 4 -> 768 per block
        shapes += [(f"backbone.adapters.{i}.D_fc1.weight", (4, C)), (f"backbone.adapters.{i}.D_fc1.bias", (4,)),
                   (f"backbone.adapters.{i}.D_fc2.weight", (C, 4)), (f"backbone.adapters.{i}.D_fc2.bias", (C,))]
    shapes += [("fc.weight", (C, C)), ("fc.bias", (C,)), ("queries", (1, 64, C)),
               ("channel_proj.weight", (256, C)), ("channel_proj.bias", (256,)),
               ("row_proj.weight", (16, 64)), ("row_proj.bias", (16,))]
    for i in range(2):  # SA_CA: two attentions and two norms, no feed-forward weights
        layer = f"decoder.layers.{i}."
        shapes += multihead_attention(layer + "self_attn.", C) + multihead_attention(layer + "multihead_attn.", C)
        shapes += [(layer + f"norm{j}.{w}", (C,)) for j in (1, 2) for w in ("weight", "bias")]
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
    transformed = {"backbone.model.pos_embed": dinov2_resampled(upstream["backbone.pos_embed"], GRID)}
    assert_placed(model, upstream, mapping, transformed)
    assert model.out_dim == 4096
    with torch.no_grad():
        assert model.eval()(torch.rand(1, 3, 322, 322)).shape == (1, 4096)
