"""What the robustness features cost: prints tables (median of several runs, ratio vs a baseline
measured in the same run).

    python benchmarks/robustness_overhead.py [--repeats 5] [--images 400]

1. NonFiniteGuard's per-step gradient check vs the forward + backward it guards (ResNet-18/50).
2. Image scans: header check vs full decode vs the plain read the loaders do anyway.
3. Checkpoint writing: atomic_save (same-folder temp file, fsync, rename) vs Lightning's
   TorchCheckpointIO (in-memory buffer + fsspec transaction) vs a bare torch.save.
"""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path

import numpy as np
import timm
import torch
from _timing import median_seconds
from lightning.pytorch.plugins.io import TorchCheckpointIO
from PIL import Image

from aggzoo.data.image_policy import scan_images
from aggzoo.data.images import read_rgb
from aggzoo.training.checkpointing import atomic_save


def guard_check(model: torch.nn.Module) -> bool:
    """The check NonFiniteGuard runs before each optimiser step."""
    grads = [p.grad.detach() for p in model.parameters() if p.grad is not None]
    return bool(torch.isfinite(torch.nn.utils.get_total_norm(grads, math.inf)))


def bench_guard(repeats: int) -> None:
    print("\n1. non-finite gradient check per step (CPU, batch 8 x 3 x 224 x 224)")
    print(f"{'model':<12}{'fwd+bwd ms':>12}{'check ms':>10}{'ratio':>8}")
    images = torch.randn(8, 3, 224, 224)
    for name in ("resnet18", "resnet50"):
        model = timm.create_model(name, pretrained=False, num_classes=0)

        def step() -> None:
            model.zero_grad(set_to_none=True)
            model(images).square().mean().backward()

        step_s = median_seconds(step, repeats)
        check_s = median_seconds(lambda: guard_check(model), repeats)
        print(f"{name:<12}{1e3 * step_s:>12.1f}{1e3 * check_s:>10.2f}{check_s / step_s:>8.3f}")


def bench_scans(num_images: int, repeats: int) -> None:
    print(f"\n2. image checks ({num_images} JPEGs of 640 x 480, quality 90), per image")
    with tempfile.TemporaryDirectory() as folder:
        paths = []
        for i in range(num_images):
            path = Path(folder) / f"{i}.jpg"
            Image.fromarray(np.random.default_rng(i).integers(0, 256, (480, 640, 3), dtype=np.uint8)).save(path, quality=90)
            paths.append(path)
        plain = median_seconds(lambda: [read_rgb(p) for p in paths], repeats) / num_images
        header = median_seconds(lambda: scan_images(paths, full=False), repeats) / num_images
        full = median_seconds(lambda: scan_images(paths, full=True), repeats) / num_images
    print(f"{'check':<28}{'ms / image':>12}{'vs read':>9}")
    for label, value in (("read_rgb (what loaders do)", plain), ("header scan", header), ("full scan", full)):
        print(f"{label:<28}{1e3 * value:>12.3f}{value / plain:>9.3f}")


def bench_save(repeats: int) -> None:
    print("\n3. writing a checkpoint (ResNet-50 weights + Adam state, about 300 MB)")
    model = timm.create_model("resnet50", pretrained=False)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    checkpoint = {"state_dict": state, "optimizer": [{k: v.clone() for k, v in state.items()} for _ in range(2)]}
    lightning_io = TorchCheckpointIO()
    with tempfile.TemporaryDirectory() as folder:
        target = Path(folder) / "last.ckpt"
        bare = median_seconds(lambda: torch.save(checkpoint, target), repeats)
        ours = median_seconds(lambda: atomic_save(checkpoint, target), repeats)
        theirs = median_seconds(lambda: lightning_io.save_checkpoint(checkpoint, target), repeats)
    print(f"{'writer':<44}{'s':>8}{'vs torch.save':>15}")
    for label, value in (("torch.save (not atomic)", bare), ("atomic_save (temp in folder, fsync, rename)", ours),
                         ("Lightning TorchCheckpointIO", theirs)):
        print(f"{label:<44}{value:>8.2f}{value / bare:>15.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--images", type=int, default=400)
    args = parser.parse_args()
    torch.manual_seed(0)
    bench_guard(args.repeats)
    bench_scans(args.images, args.repeats)
    bench_save(max(3, args.repeats // 2))


if __name__ == "__main__":
    main()
