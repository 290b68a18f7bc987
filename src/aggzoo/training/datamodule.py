"""The Lightning data module: GSV-Cities-style P x K training batches and retrieval validation."""

from __future__ import annotations

from collections.abc import Mapping

import lightning.pytorch as L
import numpy as np
import torch
from torch.utils.data import DataLoader

from aggzoo.data.gsv_cities import GSVCitiesDataset
from aggzoo.data.retrieval_set import ImageListDataset, RetrievalSet
from aggzoo.data.transforms import Transform

__all__ = ["VPRDataModule"]


class VPRDataModule(L.LightningDataModule):
    """Batches of ``places_per_batch`` (P) places x K images for training; one loader per
    validation set over its database then its queries.

    Args:
        train_dataset: the training places (its transform already set).
        val_sets: name -> retrieval set evaluated every epoch (may be empty).
        eval_transform: resize + normalise for validation and for feature sampling.
        places_per_batch: P.
        num_workers: loader processes; 0 loads in the main process.
        eval_batch_size: images per validation batch.
    """

    def __init__(self, *, train_dataset: GSVCitiesDataset, val_sets: Mapping[str, RetrievalSet],
                 eval_transform: Transform, places_per_batch: int = 32, num_workers: int = 0,
                 eval_batch_size: int = 64) -> None:
        super().__init__()
        if places_per_batch > len(train_dataset):
            raise ValueError(f"places_per_batch={places_per_batch} exceeds the {len(train_dataset)} training "
                             "places; lower data.places_per_batch")
        self.train_dataset = train_dataset
        self.val_sets = dict(val_sets)
        self.eval_transform = eval_transform
        self.places_per_batch = places_per_batch
        self.num_workers = num_workers
        self.eval_batch_size = eval_batch_size

    def _loader(self, dataset: torch.utils.data.Dataset, batch_size: int, shuffle: bool, drop_last: bool) -> DataLoader:
        return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last,
                          num_workers=self.num_workers, persistent_workers=self.num_workers > 0,
                          pin_memory=torch.cuda.is_available())

    def train_dataloader(self) -> DataLoader:
        # drop_last: a short last batch would hold too few places for the miner to find negatives.
        return self._loader(self.train_dataset, self.places_per_batch, shuffle=True, drop_last=True)

    def val_dataloader(self) -> list[DataLoader]:
        return [self._loader(ImageListDataset(s.database_paths + s.query_paths, self.eval_transform),
                             self.eval_batch_size, shuffle=False, drop_last=False) for s in self.val_sets.values()]

    def feature_sample_dataloader(self, num_images: int, *, seed: int = 0) -> DataLoader:
        """A loader over ``num_images`` random training images (eval transform), for the
        k-means initialisation of heads."""
        paths = [img.path for imgs in self.train_dataset.places.values() for img in imgs]
        rng = np.random.default_rng(seed)
        chosen = rng.choice(len(paths), size=min(num_images, len(paths)), replace=False)
        return DataLoader(ImageListDataset([paths[i] for i in sorted(chosen)], self.eval_transform),
                          batch_size=self.eval_batch_size, num_workers=self.num_workers)
