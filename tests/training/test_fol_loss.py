"""FoL's training objective against independent expectations: each term on small inputs worked out by hand or
from the authors' formulas (chenshunpeng/FoL loss.py), and gradients reaching what upstream trains."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from pytorch_metric_learning.losses import MultiSimilarityLoss
from pytorch_metric_learning.miners import MultiSimilarityMiner

from aggzoo.models.backbones.class_attention import ClassAttentionViT
from aggzoo.models.heads.fol import FoL
from aggzoo.models.vpr_model import VPRModel
from aggzoo.training.losses import FoLLoss, MetricLoss


def _loss() -> FoLLoss:
    return FoLLoss(MetricLoss(MultiSimilarityLoss(alpha=1.0, beta=50.0, base=0.0), MultiSimilarityMiner(epsilon=0.1)))


def test_kl_terms_equal_kldivloss_both_ways() -> None:
    gen = torch.Generator().manual_seed(0)
    c, i = torch.randn(3, 10, generator=gen).softmax(-1), torch.randn(3, 10, generator=gen).softmax(-1)
    kl = torch.nn.KLDivLoss(reduction="none")
    expected = kl(c.log(), i).sum(-1).mean() + kl(i.log(), c).sum(-1).mean()
    torch.testing.assert_close(FoLLoss.kl_terms(c, i), expected)


def test_match_similarity_by_hand() -> None:
    e = torch.eye(4)
    x = torch.stack([e[0], e[1], F.normalize(e[2] + e[3], dim=0), torch.zeros(4)])   # last row: padding
    y = torch.stack([F.normalize(e[0] + 0.5 * e[1], dim=0), e[1], e[3]])
    # Mutual pairs: x1-y1 (cos 1) and x0-y0 (cos 2/sqrt(5) = 0.894); x2-y2 is mutual but cos 0.707 > 0.7 too.
    expected = torch.tensor([2 / 5 ** 0.5, 1.0, 2 ** -0.5]).mean()
    torch.testing.assert_close(_loss().match_similarity_of(x, y), expected)
    # One mutual pair (x0-y0, cos 1/sqrt(5), under 0.7): the row-aligned mean, upstream's fallback.
    far = torch.stack([e[0], e[1]])
    near = torch.stack([F.normalize(e[0] + 2 * e[2], dim=0), e[2]])
    torch.testing.assert_close(_loss().match_similarity_of(far, near), (far * near).sum(-1).mean())
    assert float((far * near).sum(-1).mean()) == pytest.approx(0.5 / 5 ** 0.5)


@pytest.mark.parametrize("grid", [(23, 23), (36, 36)])
def test_window_centre_is_the_authors_patch_centre_mapping(grid: tuple[int, int]) -> None:
    # loss.py get_patch_center_mapping at 322 px: centre = patch * 14 + 7, divided by 322 / 89, rounded.
    side = 4 * grid[0] - 3
    dense = torch.arange(side * side, dtype=torch.float64).reshape(side, side, 1).expand(side, side, 2)
    loss = _loss()
    for patch in range(0, grid[0] * grid[1], 37):
        row, col = divmod(patch, grid[1])
        scale = (14 * grid[0]) / side
        r, c = round((row * 14 + 7) / scale), round((col * 14 + 7) / scale)
        expected = sum(dense[r + dr, c + dc] for dr in (-1, 0, 1) for dc in (-1, 0, 1)) / 9
        torch.testing.assert_close(loss._window_mean(dense, patch, grid), expected)


def test_weak_pairs_keep_confident_unambiguous_same_cluster_matches() -> None:
    e = torch.eye(6)
    f1 = torch.stack([e[0], e[1], e[2], e[3]], dim=1)                       # [C=6, n=4]
    f2 = torch.stack([e[1], F.normalize(e[2] + 0.1 * e[4], dim=0), e[0], e[5]], dim=1)
    p1 = torch.tensor([[1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]])          # patches 0-2 in cluster 0
    p2 = torch.tensor([[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0]])          # image 2's patch 2 is in cluster 1
    guidance = torch.tensor([0.5, 0.5, 0.5, 0.5])
    # Anchor 0 is skipped (upstream drops the first); anchor 1 -> image 2 patch 0 (cos 1); anchor 2 -> patch 1
    # (cos 0.995); anchor 3 (cluster 1) matches nothing above 0.8; image 2's patch 2 equals anchor 0 only.
    pairs = _loss().weak_pairs(f1, f2, p1, p2, guidance)
    assert [(a, p) for a, p, _ in pairs] == [(1, 0), (2, 1)]
    assert pairs[1][2] == pytest.approx(float(1 / (1 + 0.01) ** 0.5), abs=1e-6)


def test_fol_loss_trains_what_upstream_trains() -> None:
    torch.manual_seed(0)
    backbone = ClassAttentionViT("test_vit", dynamic_img_size=True, frozen_stages=0)
    model = VPRModel(backbone, functools.partial(FoL, num_clusters=4, cluster_dim=8, token_dim=8, num_selected=6,
                                                 local_dim=8, train_local=True)).train()
    images, labels = torch.randn(8, 3, 48, 48), torch.arange(2).repeat_interleave(4)
    loss_fn = _loss()
    outputs = model.head.outputs(model.backbone(images))
    loss = loss_fn(outputs, labels)
    assert torch.isfinite(loss) and set(loss_fn.last_terms) == {"global", "local", "kl", "separation", "weak"}
    torch.testing.assert_close(loss.detach(), torch.tensor(sum(loss_fn.last_terms.values())), atol=1e-5, rtol=1e-5)
    loss.backward()
    for name in ("local_adapt.upconv1.weight", "score.0.weight", "cluster_features.0.weight", "token_features.0.weight"):
        grad = dict(model.head.named_parameters())[name].grad
        assert grad is not None and grad.abs().sum() > 0, name
    # The KL term reaches the last block's attention (the importance), as upstream's loss_kl_2 does.
    assert model.backbone.model.blocks[-1].attn.qkv.weight.grad.abs().sum() > 0


def test_head_fp32_keeps_the_class_attention() -> None:
    from aggzoo.training.module import VPRLightningModule

    torch.manual_seed(0)
    model = VPRModel(ClassAttentionViT("test_vit", dynamic_img_size=True),
                     functools.partial(FoL, num_clusters=4, cluster_dim=8, token_dim=8, num_selected=6, local_dim=8))
    module = VPRLightningModule(model, loss=_loss().metric, optimizer=functools.partial(torch.optim.AdamW, lr=1e-4),
                                head_fp32=True)
    seen = {}
    model.head.register_forward_pre_hook(lambda mod, args: seen.__setitem__("attention", args[0].cls_attention.dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        descriptors = module.describe(torch.randn(2, 3, 48, 48))
    assert seen["attention"] == torch.float32 and torch.isfinite(descriptors).all()
