"""ImAge: aggregation tokens inserted where configured, frozen prefix, registers, k-means init, head."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from omegaconf import OmegaConf

from aggzoo.models.backbones.aggregation_tokens import AggregationTokenViT
from aggzoo.models.backbones.timm_backbone import TimmBackbone
from aggzoo.models.features import Features
from aggzoo.models.heads.image import ImAgeTokens
from aggzoo.models.vpr_model import VPRModel

CONF = Path(__file__).resolve().parents[2] / "conf"
T, B_INSERT = 3, 4  # test_vit: 6 blocks, width 64, patch 16, one CLS token


def _backbone(**kwargs: object) -> AggregationTokenViT:
    torch.manual_seed(0)
    return AggregationTokenViT("test_vit", num_tokens=T, insert_before_block=B_INSERT, dynamic_img_size=True,
                               **kwargs)


def _images(batch: int = 2, size: int = 64) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(1))


def test_tokens_enter_the_sequence_before_the_configured_block_without_position() -> None:
    backbone = _backbone()
    with torch.no_grad():
        backbone.aggregation_tokens.normal_()  # recognisable values
    seen: dict[int, torch.Tensor] = {}
    hooks = [block.register_forward_pre_hook(lambda _m, args, i=i: seen.__setitem__(i, args[0]))
             for i, block in enumerate(backbone.model.blocks)]
    feats = backbone(_images())
    for hook in hooks:
        hook.remove()
    n, prefix = 16, 1  # 64x64 image -> 4x4 patches, plus the CLS token
    lengths = [seen[i].shape[1] for i in range(6)]
    assert lengths == [prefix + n] * B_INSERT + [T + prefix + n] * (6 - B_INSERT)
    # the first T rows entering block b are the raw parameters: no positional embedding added
    torch.testing.assert_close(seen[B_INSERT][:, :T], backbone.aggregation_tokens.expand(2, -1, -1), atol=0, rtol=0)
    assert feats.tokens.shape == (2, T, 64) and feats.cls.shape == (2, 64) and feats.last.shape == (2, 64, 4, 4)


def test_tokens_and_cls_come_after_the_final_norm() -> None:
    backbone = _backbone()
    captured: list[torch.Tensor] = []
    hook = backbone.model.norm.register_forward_hook(lambda _m, _a, out: captured.append(out))
    with torch.no_grad():
        feats = backbone(_images())
    hook.remove()
    torch.testing.assert_close(feats.tokens, captured[0][:, :T], atol=0, rtol=0)
    torch.testing.assert_close(feats.cls, captured[0][:, T], atol=0, rtol=0)


def test_frozen_prefix_gets_no_gradient_and_runs_without_autograd() -> None:
    backbone = _backbone()
    outputs: dict[int, torch.Tensor] = {}
    hooks = [block.register_forward_hook(lambda _m, _a, out, i=i: outputs.__setitem__(i, out))
             for i, block in enumerate(backbone.model.blocks)]
    feats = backbone(_images())
    for hook in hooks:
        hook.remove()
    assert not outputs[B_INSERT - 1].requires_grad  # nothing recorded for blocks 0..b-1
    assert outputs[B_INSERT].requires_grad
    (feats.tokens.sum() + feats.last.sum() + feats.cls.sum()).backward()
    for name, param in backbone.named_parameters():
        frozen = name.startswith(("model.cls_token", "model.pos_embed", "model.patch_embed")) or any(
            name.startswith(f"model.blocks.{i}.") for i in range(B_INSERT))
        assert param.requires_grad is not frozen, name
        assert (param.grad is None) is frozen, name
    assert backbone.aggregation_tokens.grad.abs().sum() > 0


def test_without_tokens_it_is_the_plain_timm_backbone() -> None:
    backbone = _backbone()
    torch.manual_seed(0)
    plain = TimmBackbone("test_vit", dynamic_img_size=True, final_norm=True)
    plain.model.load_state_dict(backbone.model.state_dict())
    backbone.eval(), plain.eval()
    with torch.no_grad():
        reference = plain(_images())
        torch.testing.assert_close(backbone.data_init_features(_images()), reference.last, atol=1e-5, rtol=0)
        with_tokens = backbone(_images())
    # inserting tokens before block b changes what the patches see from block b on
    assert not torch.allclose(with_tokens.last, reference.last, atol=1e-3)


def test_register_models_are_supported() -> None:
    # a narrow DINOv2-with-4-registers ViT: CLS + 4 registers before the patches
    torch.manual_seed(0)
    backbone = AggregationTokenViT("vit_base_patch14_reg4_dinov2", num_tokens=2, insert_before_block=1,
                                   embed_dim=32, depth=3, num_heads=2, dynamic_img_size=True)
    assert backbone.model.num_prefix_tokens == 5
    lengths: list[int] = []
    hook = backbone.model.blocks[1].register_forward_pre_hook(lambda _m, args: lengths.append(args[0].shape[1]))
    with torch.no_grad():
        feats = backbone(_images(size=56))
    hook.remove()
    assert lengths == [2 + 5 + 16]
    assert feats.tokens.shape == (2, 2, 32) and feats.last.shape == (2, 32, 4, 4)
    assert not backbone.model.reg_token.requires_grad


def test_init_from_clusters_sets_alpha_times_normalised_centroids() -> None:
    backbone = _backbone()
    assert backbone.data_init == "kmeans" and backbone.kmeans_clusters == T
    assert backbone.aggregation_tokens.std().item() == pytest.approx(1e-6, rel=0.5)
    centroids = torch.zeros(T, 64)
    centroids[0, 0], centroids[1, 1], centroids[2, 2] = 2.0, 3.0, 0.5
    # every descriptor sits on one centroid direction: top-1 similarity 1, top-2 0 -> gap 1
    descriptors = torch.eye(64)[torch.tensor([0, 1, 2, 1, 0])]
    backbone.init_from_clusters(centroids, descriptors)
    alpha = -math.log(0.01)
    torch.testing.assert_close(backbone.aggregation_tokens[0], alpha * torch.eye(64)[:T])
    with pytest.raises(ValueError, match=r"expected centroids of shape \(3, 64\)"):
        backbone.init_from_clusters(torch.zeros(2, 64), descriptors)


def test_single_token_init_uses_the_mean_top1_similarity() -> None:
    backbone = AggregationTokenViT("test_vit", num_tokens=1, insert_before_block=2, dynamic_img_size=True)
    centroid = torch.zeros(1, 64)
    centroid[0, 0] = 1.0
    descriptors = F.normalize(torch.tensor([[1.0, 1.0] + [0.0] * 62, [1.0, 0.0] + [0.0] * 62]), dim=1)
    backbone.init_from_clusters(centroid, descriptors)
    mean_top1 = (1 / math.sqrt(2) + 1) / 2
    torch.testing.assert_close(backbone.aggregation_tokens[0, 0, 0], torch.tensor(-math.log(0.01) / mean_top1))


def test_head_flattens_token_major_and_checks_its_input() -> None:
    head = ImAgeTokens(4, num_tokens=2)
    tokens = torch.tensor([[[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]]])
    maps = (torch.zeros(1, 4, 2, 2),)
    out = head(Features(maps=maps, tokens=tokens))
    torch.testing.assert_close(out, torch.arange(1.0, 9.0).unsqueeze(0) / torch.arange(1.0, 9.0).norm())
    with pytest.raises(ValueError, match="needs a backbone that inserts aggregation tokens"):
        head(Features(maps=maps))
    with pytest.raises(ValueError, match="set the head's num_tokens to the backbone's num_tokens"):
        head(Features(maps=maps, tokens=torch.zeros(1, 3, 4)))


def test_bad_configurations_are_rejected() -> None:
    with pytest.raises(ValueError, match=r"insert_before_block must be in \[0, 5\]"):
        AggregationTokenViT("test_vit", insert_before_block=6)
    with pytest.raises(ValueError, match="needs a ViT"):
        AggregationTokenViT("test_resnet", insert_before_block=1)


def test_paper_configuration_builds_from_yaml() -> None:
    cfg = OmegaConf.load(CONF / "backbone" / "image_dinov2_vitb14_reg4.yaml")
    cfg.pretrained = False  # no network in tests; the shapes are what is checked
    model = VPRModel(instantiate(cfg), instantiate(OmegaConf.load(CONF / "head" / "image.yaml")))
    assert model.out_dim == 6144
    backbone = model.backbone
    assert backbone.num_tokens == 8 and backbone.insert_before_block == 8
    assert backbone.aggregation_tokens.shape == (1, 8, 768)
    trainable_blocks = {int(n.split(".")[2]) for n, p in backbone.named_parameters()
                        if p.requires_grad and n.startswith("model.blocks.")}
    assert trainable_blocks == {8, 9, 10, 11}
