"""A GSV-Cities folder written on the fly and a seconds-sized Lightning setup around it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as L
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader

from aggzoo.data.gsv_cities import GSVCitiesDataset
from aggzoo.data.transforms import eval_transform

HEADER = "place_id,year,month,northdeg,city_id,lat,lon,panoid\n"
NO_NORM = {"mean": (0.0, 0.0, 0.0), "std": (1.0, 1.0, 1.0)}


def write_city(root: Path, images_per_place: list[int], city: str = "Lund") -> dict[int, list[Path]]:
    """A GSV-Cities layout; image ``j`` of place ``p`` is a flat colour encoding ``(p, j)``."""
    (root / "Dataframes").mkdir(parents=True, exist_ok=True)
    (root / "Images" / city).mkdir(parents=True, exist_ok=True)
    rows, paths = [HEADER], {}
    for place, count in enumerate(images_per_place):
        for j in range(count):
            year, month, lat, pano = 2010 + j, j % 12 + 1, f"55.{place:04d}", f"p{place}i{j}"
            rows.append(f"{place},{year},{month},0,{city},{lat},13.2,{pano}\n")
            path = root / "Images" / city / f"{city}_{place:07d}_{year:04d}_{month:02d}_000_{lat}_13.2_{pano}.jpg"
            Image.new("RGB", (8, 6), (10 * place, 10 * j, 0)).save(path, quality=100)
            paths.setdefault(place, []).append(path)
    (root / "Dataframes" / f"{city}.csv").write_text("".join(rows))
    return paths


class TinyNet(nn.Module):
    """``[B, 3, H, W] -> [B, 4]`` unit rows; ``head`` is the module NaNs are injected into."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.head(self.backbone(x).mean((2, 3))), dim=1)


class TinyModule(L.LightningModule):
    """P x K batches -> a contrastive loss on cosine similarities."""

    def __init__(self) -> None:
        super().__init__()
        self.model = TinyNet()

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        images, labels = batch
        descriptors = self.model(images.flatten(0, 1))
        labels = labels.flatten()
        same = (labels[:, None] == labels[None, :]).float()
        sims = descriptors @ descriptors.T
        return ((sims - same) ** 2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


class TinyData(L.LightningDataModule):
    def __init__(self, root: Path, *, places_per_batch: int = 2, num_workers: int = 0, img_per_place: int = 2) -> None:
        super().__init__()
        self.train_dataset = GSVCitiesDataset(root, img_per_place=img_per_place, seed=0,
                                              transform=eval_transform((12, 16), **NO_NORM))
        self.places_per_batch = places_per_batch
        self.num_workers = num_workers

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_dataset, batch_size=self.places_per_batch, shuffle=False,
                          num_workers=self.num_workers, persistent_workers=self.num_workers > 0)


def tiny_trainer(root_dir: Path, callbacks: list[Any], **kwargs: Any) -> L.Trainer:
    options: dict[str, Any] = dict(max_epochs=1, accelerator="cpu", devices=1, logger=False,
                                   enable_checkpointing=False, enable_progress_bar=False,
                                   enable_model_summary=False, default_root_dir=str(root_dir))
    options.update(kwargs)
    return L.Trainer(callbacks=callbacks, **options)


def write_vg(root: Path, split: str, *, num_places: int, queries_per_place: int = 1, seed: int = 0) -> Path:
    """A VG-layout benchmark: place ``p`` sits at UTM east ``1000 * p``; its database image and
    queries share a random texture (queries are noisier copies), so retrieval is non-trivial."""
    import numpy as np

    rng = np.random.default_rng(seed)
    for part in ("database", "queries"):
        (root / "images" / split / part).mkdir(parents=True, exist_ok=True)
    for place in range(num_places):
        texture = rng.integers(0, 256, (24, 32, 3))
        name = f"@{1000.0 * place:.2f}@4000000.00@33@U@@@p{place:03d}"
        Image.fromarray(texture.astype("uint8")).save(root / "images" / split / "database" / f"{name}@.png")
        for q in range(queries_per_place):
            noisy = np.clip(texture + rng.normal(0, 60, texture.shape), 0, 255).astype("uint8")
            Image.fromarray(noisy).save(root / "images" / split / "queries" / f"{name}@q{q}@.png")
    return root
