"""EDTformer: needs the class token, uses it, channel-major layout, official keys, paper size."""

from __future__ import annotations

import pytest
import torch

from aggzoo.models.features import Features
from aggzoo.models.heads.edtformer import EDTformer


def _features(batch: int = 2, c: int = 32, h: int = 3, w: int = 4, seed: int = 0) -> Features:
    gen = torch.Generator().manual_seed(seed)
    return Features((torch.randn(batch, c, h, w, generator=gen),), cls=torch.randn(batch, c, generator=gen))


def test_missing_class_token_is_a_clear_error() -> None:
    head = EDTformer(32, num_heads=4)
    with pytest.raises(ValueError, match="class token"):
        head(Features((torch.randn(1, 32, 3, 3),)))


def test_heads_must_divide_channels() -> None:
    with pytest.raises(ValueError, match="must divide"):
        EDTformer(30, num_heads=16)


def test_class_token_changes_the_descriptor() -> None:
    torch.manual_seed(0)
    head = EDTformer(32, num_heads=4).eval()
    f = _features()
    with torch.no_grad():
        a = head(f)
        b = head(Features(f.maps, cls=f.cls + 1.0))
    assert not torch.allclose(a, b)


def _per_image_reference(head: EDTformer, f: Features) -> torch.Tensor:
    """The original's computation: every image's copy of the queries goes through every block."""
    memory = head.fc(torch.cat([f.cls.unsqueeze(1), f.last.flatten(2).transpose(1, 2)], dim=1))
    q = head.queries.expand(f.last.shape[0], -1, -1)
    for layer in head.decoder.layers:
        q = layer(q, memory)
    x = head.row_proj(head.channel_proj(q).transpose(1, 2))
    return torch.nn.functional.normalize(x.flatten(1), dim=1)


@pytest.mark.parametrize("mode", ["eval", "train without dropout"])
def test_shared_first_self_attention_equals_the_per_image_computation(mode: str) -> None:
    torch.manual_seed(0)
    head = EDTformer(32, num_heads=4, dropout=0.0 if mode.startswith("train") else 0.1)
    torch.nn.init.normal_(head.queries)  # queries that differ, so the self-attention matters
    head.train(mode.startswith("train"))
    f = _features(batch=3)
    params = list(head.parameters())
    out, reference = head(f), _per_image_reference(head, f)
    torch.testing.assert_close(out, reference, atol=1e-6, rtol=1e-5)
    probe = torch.randn_like(out)
    for got, want in zip(torch.autograd.grad((out * probe).sum(), params),
                         torch.autograd.grad((reference * probe).sum(), params), strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_training_dropout_is_drawn_per_image_as_upstream() -> None:
    torch.manual_seed(0)
    head = EDTformer(32, num_heads=4, dropout=0.5).train()
    f = _features(batch=1)
    twice = Features((f.last.expand(2, -1, -1, -1),), cls=f.cls.expand(2, -1))  # the same image twice
    seen = []
    head.decoder.layers[0].norm1.register_forward_hook(lambda module, args, out: seen.append(out))
    head(twice)
    (queries,) = seen  # the first self-attention's output: one per image, with its own dropout mask
    assert queries.shape[0] == 2 and not torch.allclose(queries[0], queries[1])
    head.eval()
    with torch.no_grad():
        head(twice)
    assert seen[1].shape[0] == 1  # in eval it ran once for the batch


def test_layout_is_channel_major() -> None:
    """With row_proj selecting query r for row r, entry (d, r) is channel d of the projected r-th query."""
    torch.manual_seed(0)
    head = EDTformer(32, num_queries=6, num_heads=4, out_channels=5, out_rows=3).eval()
    with torch.no_grad():
        head.row_proj.weight.zero_()
        head.row_proj.bias.zero_()
        for row in range(3):
            head.row_proj.weight[row, row] = 1.0
    captured = {}
    head.channel_proj.register_forward_hook(lambda _m, _i, out: captured.setdefault("y", out))
    with torch.no_grad():
        out = head(_features())
    y = captured["y"]  # [B, Q, d]
    expected = y[:, :3, :].transpose(1, 2).reshape(2, 15)
    torch.testing.assert_close(out, expected / expected.norm(dim=1, keepdim=True), atol=1e-6, rtol=1e-5)


def test_queries_start_near_zero() -> None:
    torch.manual_seed(0)
    head = EDTformer(768)
    assert 0.5e-6 < head.queries.std().item() < 1.5e-6


def test_official_keys_and_paper_configuration() -> None:
    head = EDTformer(768).eval()  # DINOv2 ViT-B/14
    attn = ["in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"]
    expected_keys = {"fc.weight", "fc.bias", "queries", "channel_proj.weight", "channel_proj.bias",
                     "row_proj.weight", "row_proj.bias"}
    for i in range(2):
        expected_keys |= {f"decoder.layers.{i}.{m}.{k}" for m in ("self_attn", "multihead_attn") for k in attn}
        expected_keys |= {f"decoder.layers.{i}.{n}.{k}" for n in ("norm1", "norm2") for k in ("weight", "bias")}
    assert set(head.state_dict()) == expected_keys
    c = 768
    layer = 2 * (4 * c * c + 4 * c) + 4 * c
    expected_params = (c * c + c) + 2 * layer + 64 * c + (c * 256 + 256) + (64 * 16 + 16)
    assert sum(p.numel() for p in head.parameters()) == expected_params == 10_293_264
    with torch.no_grad():
        out = head(_features(c=768, h=16, w=16))
    assert out.shape == (2, 4096) == (2, head.out_dim)
