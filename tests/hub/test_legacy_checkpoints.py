"""Checkpoints written before the layout change (issue 11) still load: the head classes that moved
(``multilevel.MultiLevel`` -> ``afa.AFA`` / ``ida.IDA``, ``image_tokens.ImAgeTokens`` ->
``image.ImAgeTokens``) are named by their old paths in those files' specs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import aggzoo
from aggzoo.hub.builder import build_model
from aggzoo.hub.checkpoint import SPEC_KEY
from aggzoo.models.heads.afa import AFA

_BACKBONE = {"_target_": "aggzoo.models.backbones.timm_backbone.TimmBackbone", "model_name": "test_resnet",
             "out_indices": [2, 3, 4], "pretrained": False}


def _old_multilevel_spec(attention: bool) -> dict:
    # As aggzoo.zoo.new_heads wrote it before the change (head keys in that order, _partial_ from Hydra).
    head = {"_target_": "aggzoo.models.heads.multilevel.MultiLevel", "attention": attention, "dim": None,
            "attn_dim": 64, "reduction": 16, "fuse_level": -1, "p": 3.0, "proj_dim": None, "_partial_": True}
    return {"backbone": dict(_BACKBONE), "head": head}


@pytest.mark.parametrize("attention", [True, False], ids=["afa", "ida"])
def test_an_old_training_checkpoint_rebuilds_and_gives_the_same_descriptors(attention: bool, tmp_path: Path) -> None:
    torch.manual_seed(0)
    spec = _old_multilevel_spec(attention)
    original = build_model(spec).eval()
    assert isinstance(original.head, AFA) and original.head.attention is attention
    path = tmp_path / "last.ckpt"
    torch.save({"state_dict": {f"model.{k}": v for k, v in original.state_dict().items()}, SPEC_KEY: spec}, path)
    loaded = aggzoo.create_model(str(path))
    images = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(loaded(images), original(images), rtol=0, atol=0)
    assert loaded.aggzoo_spec["head"]["_target_"] == "aggzoo.models.heads.afa.AFA"


def test_the_old_image_tokens_path_names_the_moved_class() -> None:
    spec = {"backbone": {"_target_": "aggzoo.models.backbones.aggregation_tokens.AggregationTokenViT",
                         "model_name": "test_vit", "num_tokens": 2, "insert_before_block": 1},
            "head": {"_target_": "aggzoo.models.heads.image_tokens.ImAgeTokens", "num_tokens": 2}}
    model = build_model(spec)
    assert type(model.head).__module__ == "aggzoo.models.heads.image" and model.out_dim == 2 * model.backbone.out_channels
