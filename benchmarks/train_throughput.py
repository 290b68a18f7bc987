"""Training throughput: the Lightning pipeline against a plain PyTorch loop over the same model and data.

    python benchmarks/train_throughput.py [--steps 8] [--repeats 3] [--configs default,resnet50_mixvpr]

For each configuration the same objects are built from the Hydra config by
:func:`aggzoo.run.pipeline.build_training` (model, loss, optimiser groups, LR schedule, P x K loader with
its augmentation), then timed three ways on the CPU:

- ``data``: the training loader alone (read, decode, augment, collate), images per second (best run);
- ``plain``: a hand-written loop ``for batch in loader: forward, loss, backward, step, schedule``;
- ``lightning``: ``Trainer.fit`` of :class:`~aggzoo.training.module.VPRLightningModule` with what
  ``train.py`` runs every step (per-step metric logging to CSV, learning-rate monitor, sampler
  bookkeeping, step timer), validation and checkpointing off (they happen once per epoch).

A step's time is the interval between two consecutive batch starts (so data loading is in both
loops); the first two steps of every run are dropped. The two loops run ``--repeats`` times each,
alternating (and swapping which goes first), and every figure pools the steps of all repeats: the
``min`` column is the fastest step (the cost of the step itself: other processes on a shared machine
only ever add time), ``median`` the typical one. Overhead = (lightning - plain) / plain, from the
minima (and, for reference, from the medians).

Configurations:

- ``default``: ``python train.py``'s defaults (ImageNet EfficientNet-Lite0 to stride 16 + NetVLAD-64
  on the synthetic city, 120x160, P x K = ``--places`` x 4);
- ``resnet50_mixvpr``: the MixVPR recipe's network (ResNet-50 to layer3, random init, MixVPR 4096-D at
  320x320) with a small batch (P x K = 2 x 4) on the synthetic city.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.loggers import CSVLogger
from omegaconf import DictConfig

import aggzoo  # noqa: F401  (quiet albumentations)
from aggzoo.run.pipeline import build_training, compose_run_config
from aggzoo.training.timing import StepTimer

REPO = Path(__file__).resolve().parents[1]
WARMUP = 2

CONFIGS: dict[str, list[str]] = {
    "default": [],
    "resnet50_mixvpr": ["backbone=resnet50", "backbone.pretrained=false", "backbone.frozen_stages=3",
                        "head=mixvpr", "data.places_per_batch=2", "data.image_size=[320,320]",
                        "data.eval_image_size=[320,320]", "optimizer=sgd", "optimizer.lr=0.05",
                        "scheduler=warmup_multistep", "scheduler.warmup_steps=650"],
}


def time_data(cfg: DictConfig, steps: int) -> float:
    """Images per second of the training loader alone."""
    parts = build_training(cfg)
    loader = parts.datamodule.train_dataloader()
    count, start = 0, None
    for index, (images, _) in enumerate(loader):
        if index == WARMUP:
            start, count = time.perf_counter(), 0
        count += images.shape[0] * images.shape[1]
        if index + 1 >= steps + WARMUP:
            break
    assert start is not None, "too few batches for the requested steps"
    return count / (time.perf_counter() - start)


def time_plain(cfg: DictConfig, steps: int) -> list[float]:
    """Seconds per step of a plain PyTorch loop over the same objects."""
    L.seed_everything(cfg.seed, verbose=False)
    parts = build_training(cfg)
    model, module, loader = parts.model, parts.module, parts.datamodule.train_dataloader()
    from aggzoo.training.module import parameter_groups

    base_lr = module.optimizer_factory.keywords["lr"]
    optimizer = module.optimizer_factory(parameter_groups(model, base_lr=base_lr, lr_multipliers=module.lr_multipliers,
                                                          no_weight_decay=module.no_weight_decay))
    total = steps + WARMUP + 1
    scheduler = module.scheduler_factory(optimizer, total_steps=total, steps_per_epoch=total)
    model.train()
    starts = []
    for index, (images, labels) in enumerate(loader):
        starts.append(time.perf_counter())
        descriptors = model(images.flatten(0, 1))
        loss = module.loss(descriptors, labels.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        if index + 1 >= total:
            break
    return [b - a for a, b in zip(starts, starts[1:])][WARMUP:]


def time_lightning(cfg: DictConfig, steps: int, out_dir: Path) -> list[float]:
    """Seconds per step of ``Trainer.fit`` (the pipeline's module, logging and callbacks)."""
    L.seed_everything(cfg.seed, verbose=False)
    parts = build_training(cfg)
    timer = StepTimer(warmup_steps=WARMUP)
    total = steps + WARMUP + 1
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, limit_train_batches=total, limit_val_batches=0,
                        num_sanity_val_steps=0, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, log_every_n_steps=1, default_root_dir=str(out_dir),
                        logger=CSVLogger(str(out_dir), name="csv"),
                        callbacks=[timer, LearningRateMonitor(logging_interval="step")])
    trainer.fit(parts.module, datamodule=parts.datamodule)
    return list(timer.cycle_seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8, help="timed steps per run (after 2 warm-up steps)")
    parser.add_argument("--repeats", type=int, default=4, help="alternating plain/Lightning runs per config")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, from {list(CONFIGS)}")
    parser.add_argument("--places", type=int, default=None, help="P of the default config (its default: 32)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.configs.split(","):
            overrides = list(CONFIGS[name]) + ["logger=csv_only"]
            if name == "default" and args.places:
                overrides.append(f"data.places_per_batch={args.places}")
            cfg = compose_run_config(REPO / "conf", "train", overrides, Path(tmp) / name)
            images_per_step = int(cfg.data.places_per_batch) * int(cfg.data.train.img_per_place)
            data_ips = max(time_data(cfg, args.steps) for _ in range(args.repeats))
            plain: list[float] = []
            lightning: list[float] = []
            for repeat in range(args.repeats):
                order = ("plain", "lightning") if repeat % 2 == 0 else ("lightning", "plain")
                for which in order:
                    if which == "plain":
                        plain += time_plain(cfg, args.steps)
                    else:
                        lightning += time_lightning(cfg, args.steps, Path(tmp) / f"{name}_{repeat}")
                print(f"  {name} repeat {repeat}: plain min {min(plain):.3f} / median {statistics.median(plain):.3f} "
                      f"s/step, lightning min {min(lightning):.3f} / median {statistics.median(lightning):.3f} s/step",
                      file=sys.stderr)
            p_min, l_min = min(plain), min(lightning)
            p_med, l_med = statistics.median(plain), statistics.median(lightning)
            rows.append({"config": name, "images/step": images_per_step, "data img/s (best)": data_ips,
                         "plain s/step min": p_min, "lightning s/step min": l_min,
                         "plain img/s": images_per_step / p_min, "lightning img/s": images_per_step / l_min,
                         "overhead % (min)": 100.0 * (l_min - p_min) / p_min,
                         "plain s/step median": p_med, "lightning s/step median": l_med,
                         "overhead % (median)": 100.0 * (l_med - p_med) / p_med})
    header = list(rows[0])
    print(f"train_throughput: CPU, {torch.get_num_threads()} threads, {args.steps} steps x {args.repeats} repeats per "
          f"loop; torch {torch.__version__}, lightning {L.__version__}")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(f"{v:.3f}" if isinstance(v, float) and "s/step" in k else
                                f"{v:.1f}" if isinstance(v, float) else str(v) for k, v in row.items()) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
