"""Cost of every aggregation head at its paper configuration, on CPU.

    python benchmarks/heads.py [--repeats 5] [--heads gem,afa,...] [--no-backbones]

Every ``conf/head/*.yaml`` is discovered at run time and fed synthetic outputs of the paper
backbones (batch 8), each input the head can take by what its class declares (``Head.needs_cls``,
``needs_tokens``, ``min_levels``, ``required_map_size``, ``min_positions``), one row per input:

- ``cnn``: ResNet-50 cut after layer3 at 320x320, ``maps=([8, 1024, 20, 20],)``;
- ``cnn-ml``: the same network's layer1..layer3, for multi-level heads (``min_levels > 1``),
  ``maps=([8, 256, 80, 80], [8, 512, 40, 40], [8, 1024, 20, 20])``;
- ``dinov2``: ViT-B/14 at 322x322, ``maps=([8, 768, 23, 23],)``, ``cls=[8, 768]``,
  ``tokens=[8, 8, 768]``, ``cls_attention=[8, 529]``: the only input of heads that read the CLS token or aggregation tokens,
  and the second one of single-level heads that need neither.

Columns: forward latency (eval, no_grad) and forward+backward latency (train mode, gradients for
the head's parameters *and* its input, as when the backbone is fine-tuned), medians of
``--repeats`` runs after one warm-up; the head's forward as a percentage of its backbone's forward
(ResNet-50-layer3 at 320 or ViT-B/14 at 322, random init, batch 8, measured once per run, median
of 3); peak memory.

Peak memory is read from torch.profiler's memory timeline: every allocation and free made by
torch's CPU allocator during the call, in order, summed to the highest point. It counts the
activations, temporaries and gradients the head allocates; not the inputs or weights that existed
before the call, and not memory that bypasses torch's allocator (none for these ops). RSS deltas
were not used: glibc reuses freed pages, so they under- and over-count at random.

The functions here are importable (``measure``, ``synthetic_features``, ``build_head_from_config``)
so a comparison script outside the repository can time the authors' modules the same way.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from _timing import median_seconds
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torch import Tensor, nn

from aggzoo.models.features import Features
from aggzoo.models.heads.base import Head
from aggzoo.models.vpr_model import build_head

REPO = Path(__file__).resolve().parents[1]
HEAD_CONFIGS = REPO / "conf" / "head"
BATCH = 8

#: (channels, height, width) per level, fine -> coarse, and what else the backbone returns
INPUTS: dict[str, dict[str, Any]] = {
    "cnn": {"maps": [(1024, 20, 20)], "strides": [16]},
    "cnn-ml": {"maps": [(256, 80, 80), (512, 40, 40), (1024, 20, 20)], "strides": [4, 8, 16]},
    "dinov2": {"maps": [(768, 23, 23)], "strides": [14], "cls": 768, "tokens": (8, 768)},
    "dinov2-ml": {"maps": [(768, 23, 23)] * 3, "strides": [14] * 3, "cls": 768, "tokens": (8, 768)},
}


def synthetic_features(kind: str, *, batch: int = BATCH, seed: int = 0, requires_grad: bool = False) -> Features:
    """Random backbone outputs of one of :data:`INPUTS` (ReLU'd for CNN maps, like layer outputs)."""
    spec = INPUTS[kind]
    gen = torch.Generator().manual_seed(seed)
    maps = []
    for c, h, w in spec["maps"]:
        x = torch.randn(batch, c, h, w, generator=gen)
        maps.append((x.relu() if kind.startswith("cnn") else x).requires_grad_(requires_grad))
    cls_levels = None
    if "cls" in spec:  # a ViT: the CLS of every returned block
        cls_levels = tuple(torch.randn(batch, spec["cls"], generator=gen).requires_grad_(requires_grad) for _ in maps)
    cls_attention = None
    if "cls" in spec:  # the last block's class-to-patch attention: a softmax row per head, 12 heads summed
        _, h, w = spec["maps"][-1]
        cls_attention = 12 * torch.randn(batch, h * w, generator=gen).softmax(dim=-1)
    tokens = None
    if "tokens" in spec:
        tokens = torch.randn(batch, *spec["tokens"], generator=gen).requires_grad_(requires_grad)
    return Features(maps=tuple(maps), cls=cls_levels[-1] if cls_levels else None, tokens=tokens, cls_levels=cls_levels,
                    cls_attention=cls_attention)


def feature_info(kind: str) -> list[dict[str, Any]]:
    spec = INPUTS[kind]
    return [{"num_chs": c, "reduction": s, "module": f"level{i}"} for i, ((c, _, _), s) in
            enumerate(zip(spec["maps"], spec["strides"]))]


def build_head_from_config(config: Path, kind: str) -> nn.Module:
    """Instantiate ``conf/head/<name>.yaml`` for a backbone of input kind ``kind``."""
    factory = instantiate(OmegaConf.load(config))
    return build_head(factory, SimpleNamespace(feature_info=feature_info(kind)))


def input_kinds(config: Path) -> list[str]:
    """The inputs of :data:`INPUTS` a head can take, from what its class declares."""
    head_cls: type[Head] = instantiate(OmegaConf.load(config)).func
    if head_cls.needs_cls or head_cls.needs_tokens:
        return ["dinov2-ml" if head_cls.min_levels > 1 else "dinov2"]
    if head_cls.min_levels > 1:
        return ["cnn-ml"]
    return ["cnn", "dinov2"]


def fits(head: Head, kind: str) -> bool:
    """Whether the last map of input ``kind`` has the size / number of positions the head declares."""
    _, height, width = INPUTS[kind]["maps"][-1]
    size = head.required_map_size
    return (size is None or tuple(size) == (height, width)) and height * width >= head.min_positions


# --- measurement -----------------------------------------------------------------------------


def _median_ms(fn: Callable[[], Any], repeats: int) -> float:
    return 1000 * median_seconds(fn, repeats)


def peak_mib(fn: Callable[[], Any]) -> float:
    """Peak of the bytes allocated minus freed by torch's CPU allocator while ``fn`` runs."""
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import Action

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
            fn()
        timeline = prof._memory_profile().timeline
    live = peak = 0
    for _, action, _, size in timeline:
        if action == Action.CREATE:
            live += size
        elif action == Action.DESTROY:
            live -= size
        peak = max(peak, live)
    return peak / 2**20


@dataclass
class Cost:
    forward_ms: float
    train_ms: float
    forward_mib: float
    train_mib: float


def measure(module: nn.Module, call: Callable[[nn.Module], Tensor], inputs: Sequence[Tensor], repeats: int) -> Cost:
    """Latency and peak memory of ``call(module)``; ``inputs`` are the leaf tensors it reads
    (they get gradients in the training measurement, like a fine-tuned backbone's output)."""
    out_shape = None

    def forward() -> None:
        nonlocal out_shape
        module.eval()
        with torch.no_grad():
            out_shape = call(module).shape

    forward()
    weights = torch.linspace(-1, 1, int(torch.Size(out_shape).numel())).view(out_shape)

    def train_step() -> None:
        module.train()
        for t in list(inputs) + list(module.parameters()):
            t.grad = None
        (call(module) * weights).sum().backward()

    for t in inputs:
        t.requires_grad_(True)
    return Cost(
        forward_ms=_median_ms(forward, repeats),
        train_ms=_median_ms(train_step, repeats),
        forward_mib=peak_mib(forward),
        train_mib=peak_mib(train_step),
    )


def call_head(features: Features) -> Callable[[nn.Module], Tensor]:
    return lambda head: head(features)


def leaves(features: Features) -> list[Tensor]:
    return [t for t in (*features.maps, *(features.cls_levels or (features.cls,)), features.tokens) if t is not None]


def backbone_forward_ms(repeats: int = 3) -> dict[str, float]:
    """Forward latency of the two reference backbones (random init, batch 8, no_grad)."""
    from aggzoo.models.backbones.timm_backbone import TimmBackbone

    setups = {
        "cnn": (TimmBackbone("resnet50", out_indices=(3,)), 320),
        "dinov2": (TimmBackbone("vit_base_patch14_dinov2", img_size=322), 322),
    }
    result = {}
    for kind, (backbone, size) in setups.items():
        backbone.eval()
        images = torch.randn(BATCH, 3, size, size)
        with torch.no_grad():
            result[kind] = _median_ms(lambda: backbone(images), repeats)
    result["cnn-ml"] = result["cnn"]  # the multi-level maps come from the same forward
    result["dinov2-ml"] = result["dinov2"]
    return result


# --- the table -------------------------------------------------------------------------------


def run(configs: Sequence[Path], repeats: int, with_backbones: bool) -> list[dict[str, Any]]:
    backbone_ms = backbone_forward_ms() if with_backbones else {}
    if backbone_ms:
        print("backbone forward ms: " + ", ".join(f"{k} {v:.0f}" for k, v in backbone_ms.items()), flush=True)
    print(HEADER, flush=True)
    rows = []
    for config in configs:
        for kind in input_kinds(config):
            row: dict[str, Any] = {"head": config.stem}
            try:
                torch.manual_seed(0)
                head = build_head_from_config(config, kind)
                if not fits(head, kind):
                    continue
                features = synthetic_features(kind)
                cost = measure(head, call_head(features), leaves(features), repeats)
            except Exception as error:  # noqa: BLE001 - a head that cannot run here gets a row saying why
                row["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:90]}"
            else:
                row.update(
                    input=kind, dim=head.out_dim, params=sum(p.numel() for p in head.parameters()),
                    cost=cost, backbone_ms=backbone_ms.get(kind), error=None,
                )
            rows.append(row)
            print(_format_row(row), flush=True)
    return rows


HEADER = (f"{'head':<14} {'input':<9} {'D':>6} {'params':>8} {'fwd ms':>8} {'fwd+bwd ms':>10} "
          f"{'% bb fwd':>8} {'peak MiB fwd':>12} {'peak MiB f+b':>12}")


def _format_row(row: dict[str, Any]) -> str:
    if row.get("error") and "cost" not in row:
        return f"{row['head']:<14} {'-':<9} not measured: {row['error']}"
    cost: Cost = row["cost"]
    share = f"{100 * cost.forward_ms / row['backbone_ms']:.1f}" if row.get("backbone_ms") else "-"
    return (f"{row['head']:<14} {row['input']:<9} {row['dim']:>6} {row['params'] / 1e6:>7.2f}M "
            f"{cost.forward_ms:>8.1f} {cost.train_ms:>10.1f} {share:>8} {cost.forward_mib:>12.1f} {cost.train_mib:>12.1f}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per head (median)")
    parser.add_argument("--heads", default="", help="comma-separated conf/head names (default: all)")
    parser.add_argument("--no-backbones", action="store_true", help="skip the backbone reference forward")
    args = parser.parse_args(argv)
    configs = sorted(HEAD_CONFIGS.glob("*.yaml"))
    if args.heads:
        wanted = set(args.heads.split(","))
        unknown = wanted - {c.stem for c in configs}
        if unknown:
            sys.exit(f"unknown heads {sorted(unknown)}; available: {[c.stem for c in configs]}")
        configs = [c for c in configs if c.stem in wanted]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {BATCH}")
    if not args.no_backbones:
        print("measuring the reference backbones (ResNet-50 layer3 @320, ViT-B/14 @322) ...", flush=True)
    run(configs, args.repeats, not args.no_backbones)


if __name__ == "__main__":
    main()
