"""LoPA (EDTformer's parallel low-rank adapters): the parallel stream's formula, its zero-initialised
start, and what trains."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from aggzoo.models.backbones.lopa import LoPAAdapter, LoPAViT


def _vit(**kwargs: object) -> LoPAViT:
    torch.manual_seed(0)
    return LoPAViT("test_vit", dynamic_img_size=True, **kwargs).eval()


def _plain_tokens(backbone: LoPAViT, images: torch.Tensor) -> list[torch.Tensor]:
    """x_0 (embedded tokens) and every block's output x_1..x_L of the plain ViT."""
    outs = [backbone.embed_tokens(images)]
    for block in backbone.model.blocks:
        outs.append(block(outs[-1]))
    return outs


def test_zero_initialised_adapters_give_the_normalised_sum_of_every_block_output() -> None:
    backbone = _vit()
    images = torch.randn(2, 3, 64, 80)
    with torch.no_grad():
        features = backbone(images)
        xs = _plain_tokens(backbone, images)
        expected = backbone.model.norm(sum(xs))  # y_L = x_0 + x_1 + ... + x_L while every fc2 is zero
    torch.testing.assert_close(features.cls, expected[:, 0])
    torch.testing.assert_close(features.last, expected[:, 1:].reshape(2, 4, 5, -1).permute(0, 3, 1, 2))


def test_parallel_stream_follows_y_i_equals_adapter_of_y_plus_x() -> None:
    backbone = _vit(adapter_dim=3, adapter_scale=0.7)
    for p in backbone.adapters.parameters():
        torch.nn.init.normal_(p, std=0.2)
    images = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        xs = _plain_tokens(backbone, images)
        y = xs[0]
        for x, adapter in zip(xs[1:], backbone.adapters, strict=True):
            z = y + x
            y = z + 0.7 * (F.gelu(z @ adapter.fc1.weight.T + adapter.fc1.bias) @ adapter.fc2.weight.T
                           + adapter.fc2.bias)
        expected = backbone.model.norm(y)
        torch.testing.assert_close(backbone(images).cls, expected[:, 0], atol=1e-5, rtol=1e-5)


def test_only_the_adapters_train_by_default_and_the_vit_stays_untouched() -> None:
    backbone = _vit().train()
    trainable = {n for n, p in backbone.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith("adapters.") for n in trainable)
    assert not backbone.model.norm.weight.requires_grad  # the final norm too, as upstream
    assert all(not m.training for m in backbone.model.modules() if not list(m.children()))
    out = backbone(torch.randn(2, 3, 32, 32))
    (out.cls.square().sum() + out.last.square().sum()).backward()
    assert all(p.grad is not None for n, p in backbone.named_parameters() if n in trainable)
    assert all(p.grad is None for p in backbone.model.parameters())
    assert LoPAAdapter(8).fc2.weight.abs().sum() == 0  # upstream zero-initialises fc2
    partly = _vit(frozen_stages=2)  # an integer: TimmBackbone's rule, later blocks and norm train
    assert partly.model.norm.weight.requires_grad and not partly.model.blocks[0].norm1.weight.requires_grad
