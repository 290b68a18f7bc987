"""Generalized pooling (Lee et al., AISTATS 2016): mixed, gated and tree pooling against a brute-force
loop over the windows, the tree's recursion by hand, and convert_pooling on a real timm network."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aggzoo.hub.builder import build_model
from aggzoo.layers.generalized_pooling import GatedPool2d, MixedPool2d, TreePool2d
from aggzoo.models.backbones.timm_backbone import TimmBackbone
from aggzoo.models.generalized_pooling import convert_pooling


def _windows(x: torch.Tensor, k: int, s: int, p: int, ceil: bool) -> list[list[torch.Tensor]]:
    """Every k x k window of ``x [B, C, H, W]`` as a ``[B, C, k*k]`` tensor, zero padded, with a mask
    of the positions inside the input, by explicit loops (the independent reference)."""
    _, _, h, w = x.shape
    padded = torch.nn.functional.pad(x, (p, p + k, p, p + k))
    inside = torch.nn.functional.pad(torch.ones(h, w), (p, p + k, p, p + k))
    def count(n: int) -> int:
        span = n + 2 * p - k
        out = (-(-span // s) if ceil else span // s) + 1
        return out - 1 if ceil and (out - 1) * s >= n + p else out
    return [[(padded[..., i * s:i * s + k, j * s:j * s + k].flatten(2), inside[i * s:i * s + k, j * s:j * s + k].flatten().bool())
             for j in range(count(w))] for i in range(count(h))]


def _brute(x: torch.Tensor, k: int, s: int, p: int, ceil: bool, fn) -> torch.Tensor:
    rows = [[fn(win, mask) for win, mask in row] for row in _windows(x, k, s, p, ceil)]
    return torch.stack([torch.stack(row, dim=-1) for row in rows], dim=-2)


@pytest.mark.parametrize(("k", "s", "p", "ceil"), [(3, 2, 1, False), (2, 2, 0, True), (3, 1, 0, False)])
def test_each_kind_is_its_formula_on_every_window(k: int, s: int, p: int, ceil: bool) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 7, 6)
    mixed = MixedPool2d(k, s, p, ceil_mode=ceil, count_include_pad=False, mix=0.3)
    gated = GatedPool2d(k, s, p, ceil_mode=ceil, count_include_pad=False)
    tree = TreePool2d(k, s, p, ceil_mode=ceil, count_include_pad=False)
    with torch.no_grad():
        gated.gate.normal_()
        tree.gates.normal_()
    w, (v1, v2), g = gated.gate.flatten(), tree.leaves.flatten(1), tree.gates[0].flatten()

    def mx(win, mask):
        return win[..., mask].amax(-1)

    def avg(win, mask):
        return win[..., mask].mean(-1)

    def gated_ref(win, mask):
        gate = torch.sigmoid(win @ w)
        return gate * mx(win, mask) + (1 - gate) * avg(win, mask)

    def tree_ref(win, mask):
        gate = torch.sigmoid(win @ g)
        return gate * (win @ v1) + (1 - gate) * (win @ v2)

    with torch.no_grad():
        torch.testing.assert_close(mixed(x), _brute(x, k, s, p, ceil, lambda a, m: 0.3 * mx(a, m) + 0.7 * avg(a, m)))
        torch.testing.assert_close(gated(x), _brute(x, k, s, p, ceil, gated_ref))
        torch.testing.assert_close(tree(x), _brute(x, k, s, p, ceil, tree_ref))


def test_a_three_level_tree_nests_the_gates_in_heap_order() -> None:
    torch.manual_seed(1)
    tree = TreePool2d(2, 2, levels=3)
    with torch.no_grad():
        tree.gates.normal_()
    x = torch.randn(1, 2, 4, 4)
    win = x.unfold(2, 2, 2).unfold(3, 2, 2).flatten(-2)  # [B, C, 2, 2, 4]
    leaf = [win @ v.flatten() for v in tree.leaves]
    gate = [torch.sigmoid(win @ g.flatten()) for g in tree.gates]
    left = gate[1] * leaf[0] + (1 - gate[1]) * leaf[1]
    right = gate[2] * leaf[2] + (1 - gate[2]) * leaf[3]
    with torch.no_grad():
        torch.testing.assert_close(tree(x), gate[0] * left + (1 - gate[0]) * right)
    assert tree.leaves.numel() + tree.gates.numel() == 7 * 4


def test_parameter_counts_are_the_papers_for_3x3_windows() -> None:
    counts = [sum(p.numel() for p in layer.parameters()) for layer in (MixedPool2d(3), GatedPool2d(3), TreePool2d(3))]
    assert counts == [1, 9, 27]


def test_converted_mixed_pooling_starts_as_the_network_it_replaces_and_trains() -> None:
    # test_resnet holds a stem MaxPool2d(3, 2, 1) and ResNet-D AvgPool2d(2, 2, ceil_mode=True) downsamples
    torch.manual_seed(0)
    plain = TimmBackbone("test_resnet", out_indices=(3,)).eval()
    kinds = {type(m) for m in plain.modules()}
    assert {nn.MaxPool2d, nn.AvgPool2d} <= kinds
    converted = TimmBackbone("test_resnet", out_indices=(3,), pooling="mixed").eval()
    converted.load_state_dict(plain.state_dict(), strict=False)
    images = torch.randn(2, 3, 65, 67)  # odd sizes: the ceil_mode windows
    with torch.no_grad():
        torch.testing.assert_close(converted(images).last, plain(images).last, rtol=0, atol=0)
    assert not any(type(m) in (nn.MaxPool2d, nn.AvgPool2d) for m in converted.modules())
    converted.train()
    converted(images).last.sum().backward()
    mixes = [m.mix for m in converted.modules() if isinstance(m, MixedPool2d)]
    assert mixes and all(m.grad is not None for m in mixes)


def test_the_spec_rebuilds_the_converted_layers() -> None:
    spec = {"backbone": {"_target_": "aggzoo.models.backbones.timm_backbone.TimmBackbone", "model_name": "test_resnet",
                         "out_indices": [3], "pooling": "tree"},
            "head": {"_target_": "aggzoo.models.heads.gem.GeM"}}
    torch.manual_seed(0)
    first = build_model(spec)
    torch.manual_seed(1)
    second = build_model(spec)
    second.load_state_dict(first.state_dict(), strict=True)
    assert any(isinstance(m, TreePool2d) for m in second.modules())


def test_bad_requests_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="mixed, gated, tree"):
        convert_pooling(nn.Sequential(nn.MaxPool2d(2)), "median")
    with pytest.raises(ValueError, match="dilated"):
        convert_pooling(nn.Sequential(nn.MaxPool2d(3, dilation=2)), "gated")
    with pytest.raises(ValueError, match="no nn.MaxPool2d"):
        convert_pooling(nn.Sequential(nn.Conv2d(1, 1, 1)), "gated")
