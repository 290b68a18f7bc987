"""Hydra composition of tiny training configs and ``python train.py`` subprocesses, for tests/training."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

from omegaconf import DictConfig

from aggzoo.run.pipeline import compose_run_config

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"

#: seconds-sized stand-ins: tiny synthetic city, tiny random backbone, small images, CSV logs only
TINY = ["synthetic=tiny", "backbone=test_resnet", "data.image_size=[48,64]", "data.eval_image_size=[48,64]",
        "callbacks.head_data_init.num_images=24", "callbacks.head_data_init.descriptors_per_image=8",
        "logger=csv_only", "callbacks.progress_bar.refresh_rate=0", "trainer.log_every_n_steps=1"]


def compose_train(overrides: list[str], out_dir: Path, *, name: str = "train") -> DictConfig:
    """The composed ``train.yaml`` (or ``eval.yaml``) with its output folder set to ``out_dir``."""
    return compose_run_config(CONF, name, overrides, out_dir)


def train_py(args: list[str], data_root: Path, *, timeout: float = 240, launch_dir: Path | None = None,
             script: str = "train.py") -> subprocess.CompletedProcess:
    """``python train.py <args>`` (or another entry point, ``script="eval.py"``) with the test data
    folder, output captured. By default it runs in the repository with ``AGGZOO_ROOT`` set; with
    ``launch_dir`` it runs there, ``AGGZOO_ROOT`` unset, as a user's plain command does
    (paths.root_dir is then that folder)."""
    return subprocess.run([sys.executable, str(REPO / script), *args], cwd=launch_dir or REPO,
                          env=train_env(data_root, launch_dir), capture_output=True, text=True, timeout=timeout)


def train_env(data_root: Path, launch_dir: Path | None = None) -> dict[str, str]:
    """The environment of :func:`train_py` (for tests that start ``python train.py`` with ``Popen``)."""
    # tests/ on the path: the fault-injection callbacks (tests/faults.py) are test tools, not package code.
    pythonpath = os.pathsep.join(p for p in (str(REPO / "tests"), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, AGGZOO_DATA=str(data_root), AGGZOO_ROOT=str(REPO), NO_ALBUMENTATIONS_UPDATE="1",
               PYTHONUNBUFFERED="1", HYDRA_FULL_ERROR="1", PYTHONPATH=pythonpath)
    if launch_dir is not None:
        del env["AGGZOO_ROOT"]
    return env


def run_dirs(log_dir: Path) -> list[Path]:
    """Single-run folders under ``<log_dir>/train/runs``, oldest first."""
    return sorted((log_dir / "train" / "runs").glob("*"))


def logged(run_dir: Path, key: str) -> dict[int, float]:
    """``{step: value}`` of one metric over all CSV log versions of a run."""
    values: dict[int, float] = {}
    for path in sorted(run_dir.glob("csv/*/metrics.csv")):
        with path.open() as handle:
            for row in csv.DictReader(handle):
                if row.get(key):
                    values[int(row["step"])] = float(row[key])
    return values


def tiny_fit_parts(model, gsv_root: Path, *, lr: float = 1e-3, image_size: tuple[int, int] = (32, 48)):
    """``(LightningModule, DataModule)`` for a direct ``L.Trainer.fit`` of ``model`` on the tiny city's
    GSV-Cities split: multi-similarity loss, AdamW at ``lr``, 4 places x 4 images, no validation sets."""
    import functools

    import torch
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from aggzoo.data.gsv_cities import GSVCitiesDataset
    from aggzoo.data.transforms import eval_transform
    from aggzoo.training.datamodule import VPRDataModule
    from aggzoo.training.module import VPRLightningModule

    module = VPRLightningModule(model, loss=instantiate(OmegaConf.load(CONF / "loss" / "multisimilarity.yaml")),
                                optimizer=functools.partial(torch.optim.AdamW, lr=lr))
    transform = eval_transform(image_size)
    data = VPRDataModule(train_dataset=GSVCitiesDataset(gsv_root, img_per_place=4, transform=transform),
                         val_sets={}, eval_transform=transform, places_per_batch=4)
    return module, data
