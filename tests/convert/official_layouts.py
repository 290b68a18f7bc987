"""Upstream checkpoint layouts, written down from the authors' code (see each converter's docstring
for the repo:path), with distinct values in every tensor so a misplaced tensor cannot go unnoticed.

Imported as a top-level module (pytest puts this folder on sys.path).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch
import torch.nn.functional as F
import torchvision
from torch import Tensor

Shapes = list[tuple[str, tuple[int, ...]]]

PATCH = 14
DINOV2_GRID = 37  # 518 / 14: the grid DINOv2's pos_embed is stored for
DINOV2_DIM = 768


LAYOUTS = Path(__file__).with_name("layouts")


def authors_layout(name: str) -> Shapes:
    """The key names and shapes of one released checkpoint, dumped from the authors' own module with random
    weights (``tests/convert/layouts/<name>.json``: ``{"source": "<repo>@<commit>:<file> <how built>",
    "keys": [[key, [shape...]], ...]}``), not typed by hand. Facts only: no upstream code is stored."""
    import json

    data = json.loads((LAYOUTS / f"{name}.json").read_text())
    if not data.get("source") or not data.get("keys"):
        raise ValueError(f"{name}.json: needs a 'source' and a non-empty 'keys' list")
    return [(str(key), tuple(int(n) for n in shape)) for key, shape in data["keys"]]


def fill(shapes: Iterable[tuple[str, tuple[int, ...]]]) -> dict[str, Tensor]:
    """Tensor ``i`` holds ``arange(numel) + 1000 i`` (integers, exact in fp32): no two are equal."""
    out: dict[str, Tensor] = {}
    for i, (key, shape) in enumerate(shapes):
        if key.endswith("num_batches_tracked"):
            out[key] = torch.tensor(1000 + i, dtype=torch.long)
        else:
            out[key] = (torch.arange(math.prod(shape), dtype=torch.float32) + 1000.0 * i).reshape(shape)
    return out


def prefixed(prefix: str, shapes: Shapes) -> Shapes:
    return [(prefix + k, s) for k, s in shapes]


@functools.cache
def _torchvision_resnet_state(depth: int) -> tuple[tuple[str, tuple[int, ...]], ...]:
    with torch.device("meta"):  # names and shapes only: no weight initialisation
        net = getattr(torchvision.models, f"resnet{depth}")(weights=None)
    return tuple((k, tuple(v.shape)) for k, v in net.state_dict().items())


def torchvision_resnet(depth: int = 50, *, last_layer: int = 4, sequential: bool = False) -> Shapes:
    """torchvision ResNet parameter/buffer names and shapes (the upstream module itself), without
    ``fc``; ``last_layer`` cuts after layer3 or layer4; ``sequential`` renames the children by their
    ``nn.Sequential(*children())`` index (0 conv1, 1 bn1, 4..7 layer1..layer4)."""
    index = {"conv1": 0, "bn1": 1, "layer1": 4, "layer2": 5, "layer3": 6, "layer4": 7}
    keep = {"conv1", "bn1"} | {f"layer{i}" for i in range(1, last_layer + 1)}
    out = []
    for key, shape in _torchvision_resnet_state(depth):
        child, _, rest = key.partition(".")
        if child not in keep:
            continue
        out.append((f"{index[child]}.{rest}" if sequential else key, shape))
    return out


def dinov2_hub(depth: int, *, registers: int = 0, mask_token: bool = True, norm: bool = True) -> Shapes:
    """facebookresearch/dinov2 ``DinoVisionTransformer`` (ViT-B/14, ``block_chunks=0``) state dict."""
    c = DINOV2_DIM
    out: Shapes = [("cls_token", (1, 1, c)), ("pos_embed", (1, 1 + DINOV2_GRID**2, c))]
    if registers:
        out.append(("register_tokens", (1, registers, c)))
    if mask_token:
        out.append(("mask_token", (1, c)))
    out += [("patch_embed.proj.weight", (c, 3, PATCH, PATCH)), ("patch_embed.proj.bias", (c,))]
    for b in range(depth):
        p = f"blocks.{b}."
        out += [
            (p + "norm1.weight", (c,)), (p + "norm1.bias", (c,)),
            (p + "attn.qkv.weight", (3 * c, c)), (p + "attn.qkv.bias", (3 * c,)),
            (p + "attn.proj.weight", (c, c)), (p + "attn.proj.bias", (c,)),
            (p + "ls1.gamma", (c,)),
            (p + "norm2.weight", (c,)), (p + "norm2.bias", (c,)),
            (p + "mlp.fc1.weight", (4 * c, c)), (p + "mlp.fc1.bias", (4 * c,)),
            (p + "mlp.fc2.weight", (c, 4 * c)), (p + "mlp.fc2.bias", (c,)),
            (p + "ls2.gamma", (c,)),
        ]
    if norm:
        out += [("norm.weight", (c,)), ("norm.bias", (c,))]
    return out


def multihead_attention(prefix: str, dim: int) -> Shapes:
    """``nn.MultiheadAttention`` (batch_first, bias) names."""
    return [(prefix + "in_proj_weight", (3 * dim, dim)), (prefix + "in_proj_bias", (3 * dim,)),
            (prefix + "out_proj.weight", (dim, dim)), (prefix + "out_proj.bias", (dim,))]


def dinov2_positions(pos_embed: Tensor, grid: tuple[int, int], num_prefix: int = 1) -> Tensor:
    """What DINOv2's ``interpolate_pos_encoding`` adds for a ``grid = (g_h, g_w)`` patch grid, from the
    stored ``[1, num_prefix + 37 * 37, C]`` embedding: bicubic, ``scale_factor = (g + 0.1) / 37`` per
    axis, no antialias, computed here with ``F.interpolate`` directly (the reference the models must match)."""
    if tuple(grid) == (DINOV2_GRID, DINOV2_GRID):
        return pos_embed
    prefix, patches = pos_embed[:, :num_prefix], pos_embed[:, num_prefix:]
    maps = patches.float().reshape(1, DINOV2_GRID, DINOV2_GRID, -1).permute(0, 3, 1, 2)
    scale = ((grid[0] + 0.1) / DINOV2_GRID, (grid[1] + 0.1) / DINOV2_GRID)
    maps = F.interpolate(maps, scale_factor=scale, mode="bicubic", antialias=False)
    assert tuple(maps.shape[-2:]) == tuple(grid)
    return torch.cat([prefix, maps.permute(0, 2, 3, 1).reshape(1, grid[0] * grid[1], -1)], dim=1)


def salad_aggregator(prefix: str, *, cluster_dim: int) -> Shapes:
    """serizba/salad ``models/aggregators/salad.py`` (m = 64, ``cluster_dim`` = l) under ``prefix``."""
    return prefixed(prefix, [
        ("token_features.0.weight", (512, DINOV2_DIM)), ("token_features.0.bias", (512,)),
        ("token_features.2.weight", (256, 512)), ("token_features.2.bias", (256,)),
        ("cluster_features.0.weight", (512, DINOV2_DIM, 1, 1)), ("cluster_features.0.bias", (512,)),
        ("cluster_features.3.weight", (cluster_dim, 512, 1, 1)), ("cluster_features.3.bias", (cluster_dim,)),
        ("score.0.weight", (512, DINOV2_DIM, 1, 1)), ("score.0.bias", (512,)),
        ("score.3.weight", (64, 512, 1, 1)), ("score.3.bias", (64,)),
        ("dust_bin", ()),
    ])


def qaa_aggregator(prefix: str, *, channels: int = DINOV2_DIM, clusters: int = 64, cluster_dim: int = 128,
                   queries: int = 256) -> Shapes:
    """gmberton/VPR-methods-evaluation ``vpr_models/qaa.py`` ``QAAAggregator`` at its defaults, with the
    three tensors its forward never reads (``dust_bin``, ``score.norm2_out.*``)."""
    out: Shapes = []
    for name, dim in (("queries_feature", cluster_dim), ("queries_score", channels)):
        out += [(f"{prefix}{name}.queries", (1, queries, dim))]
        out += multihead_attention(f"{prefix}{name}.self_attn.", dim)
        out += [(f"{prefix}{name}.norm_q.weight", (dim,)), (f"{prefix}{name}.norm_q.bias", (dim,))]
    out += multihead_attention(f"{prefix}score.cross_attn.", channels)
    out += [(f"{prefix}score.norm_out.weight", (channels,)), (f"{prefix}score.norm_out.bias", (channels,)),
            (f"{prefix}score.conv.weight", (clusters, channels, 1)), (f"{prefix}score.conv.bias", (clusters,)),
            (f"{prefix}score.norm2_out.weight", (clusters,)), (f"{prefix}score.norm2_out.bias", (clusters,)),
            (f"{prefix}dust_bin", ())]
    return out


def boq_aggregator(p: int, in_channels: int, *, queries: int = 64, layers: int = 2, rows: int = 32) -> Shapes:
    """amaralibey/Bag-of-Queries ``src/boq.py`` under ``aggregator.``."""
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


def edtformer_layout(depth: int) -> Shapes:
    """Tong-Jin01/EDTformer ``VPRNet`` state dict: DINOv2 under ``backbone.``, LoPA adapters
    (``backbone/LadderAdapter.py``: Linear 768 -> 4 -> 768 per block) and the decoder head at the top level."""
    c = DINOV2_DIM
    shapes = prefixed("backbone.", dinov2_hub(depth))
    for i in range(depth):
        shapes += [(f"backbone.adapters.{i}.D_fc1.weight", (4, c)), (f"backbone.adapters.{i}.D_fc1.bias", (4,)),
                   (f"backbone.adapters.{i}.D_fc2.weight", (c, 4)), (f"backbone.adapters.{i}.D_fc2.bias", (c,))]
    shapes += [("fc.weight", (c, c)), ("fc.bias", (c,)), ("queries", (1, 64, c)),
               ("channel_proj.weight", (256, c)), ("channel_proj.bias", (256,)),
               ("row_proj.weight", (16, 64)), ("row_proj.bias", (16,))]
    for i in range(2):  # SA_CA: two attentions and two norms, no feed-forward weights
        layer = f"decoder.layers.{i}."
        shapes += multihead_attention(layer + "self_attn.", c) + multihead_attention(layer + "multihead_attn.", c)
        shapes += [(layer + f"norm{j}.{w}", (c,)) for j in (1, 2) for w in ("weight", "bias")]
    return shapes


def save(obj: object, path: Path) -> Path:
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(dict(obj), str(path))  # type: ignore[arg-type]
    else:
        torch.save(obj, path)
    return path


def assert_placed(model: torch.nn.Module, upstream: Mapping[str, Tensor], mapping: Mapping[str, str | None],
                  transformed: Mapping[str, Tensor] | None = None) -> None:
    """Every upstream tensor sits, unchanged (or as ``transformed[target]``), at its target key; every
    model tensor came from the checkpoint; dropped keys are exactly those mapped to ``None``."""
    own = model.state_dict()
    transformed = transformed or {}
    targets = set()
    for key, tensor in upstream.items():
        target = mapping[key]
        if target is None:
            continue
        targets.add(target)
        expected = transformed.get(target, tensor)
        assert target in own, f"{key} -> {target}: not a model key"
        assert torch.equal(own[target].to(expected.dtype), expected), f"{key} -> {target}: wrong values"
    untouched = sorted(set(own) - targets)
    assert not untouched, f"model keys filled from nowhere: {untouched[:10]}"
