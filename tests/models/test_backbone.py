"""TimmBackbone: levels, channels, CLS tokens, freezing, clear errors."""

from __future__ import annotations

import pytest
import torch

from aggzoo.models.backbones.timm_backbone import TimmBackbone


@pytest.mark.parametrize("name", ["test_resnet", "test_efficientnet", "test_convnext"])
def test_cnn_levels_match_feature_info(name: str) -> None:
    backbone = TimmBackbone(name, out_indices=(-3, -2, -1))
    features = backbone(torch.randn(2, 3, 64, 96))
    assert len(features.maps) == 3 and features.cls is None
    for fmap, info in zip(features.maps, backbone.feature_info, strict=True):
        assert fmap.shape == (2, info["num_chs"], 64 // info["reduction"], 96 // info["reduction"])
    assert backbone.out_channels == features.last.shape[1]


def test_cut_after_a_stage_removes_later_stages() -> None:
    full = TimmBackbone("test_resnet")
    cut = TimmBackbone("test_resnet", out_indices=(3,))
    assert cut.feature_info[-1]["module"] == "layer3"
    assert not any(k.startswith("model.layer4") for k in cut.state_dict())
    assert any(k.startswith("model.layer4") for k in full.state_dict())
    assert sum(p.numel() for p in cut.parameters()) < sum(p.numel() for p in full.parameters())


def test_vit_gives_patch_map_and_cls_at_dynamic_size() -> None:
    backbone = TimmBackbone("test_vit", dynamic_img_size=True)
    features = backbone(torch.randn(2, 3, 96, 128))
    reduction = backbone.feature_info[-1]["reduction"]
    assert features.last.shape == (2, backbone.out_channels, 96 // reduction, 128 // reduction)
    assert features.cls is not None and features.cls.shape == (2, backbone.out_channels)


def test_vit_final_norm_applies_layernorm() -> None:
    torch.manual_seed(0)
    normed = TimmBackbone("test_vit", final_norm=True)
    raw = TimmBackbone("test_vit", final_norm=False)
    raw.load_state_dict(normed.state_dict(), strict=False)
    x = torch.randn(1, 3, 160, 160)
    with torch.no_grad():
        a, b = normed(x).last, raw(x).last
        expected = normed.model.norm(b.flatten(2).transpose(1, 2)).transpose(1, 2).reshape_as(b)
    torch.testing.assert_close(a, expected)


def test_frozen_stages_get_no_grad_and_stay_in_eval() -> None:
    backbone = TimmBackbone("test_resnet", frozen_stages=3)  # stem, layer1, layer2
    frozen = {n for n, p in backbone.named_parameters() if not p.requires_grad}
    assert any(n.startswith("model.layer2.") for n in frozen)
    assert not any(n.startswith("model.layer3.") for n in frozen)
    assert "model.bn1.weight" in frozen  # the stem
    backbone.train()
    bn_stem, bn_layer3 = backbone.model.bn1, backbone.model.layer3[0].bn1
    assert not bn_stem.training and bn_layer3.training
    before = bn_stem.running_mean.clone()
    backbone(torch.randn(2, 3, 64, 64)).last.sum().backward()
    torch.testing.assert_close(bn_stem.running_mean, before)
    assert backbone.model.layer3[0].conv1.weight.grad is not None
    assert backbone.model.bn1.weight.grad is None


def test_vit_freezes_embeddings_and_first_blocks() -> None:
    backbone = TimmBackbone("test_vit", frozen_stages=2)
    grads = {n: p.requires_grad for n, p in backbone.named_parameters()}
    assert not grads["model.cls_token"] and not grads["model.pos_embed"]
    assert not grads["model.blocks.1.mlp.fc1.weight"] and grads["model.blocks.2.mlp.fc1.weight"]


def test_bad_out_index_and_frozen_stages_are_explained() -> None:
    with pytest.raises(ValueError, match="outside the 5 levels"):
        TimmBackbone("test_resnet", out_indices=(7,))
    with pytest.raises(ValueError, match="frozen_stages"):
        TimmBackbone("test_resnet", frozen_stages=9)
