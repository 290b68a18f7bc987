"""What every evaluation format loads into: database and query images with known positives."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from aggzoo.data.images import read_rgb

__all__ = ["RetrievalSet", "ImageListDataset"]


@dataclass(frozen=True)
class RetrievalSet:
    """A retrieval benchmark in memory: paths and ground truth, never pixels.

    Attributes:
        name: benchmark name used in reports.
        database_paths: ``N_db`` image paths.
        query_paths: ``N_q`` image paths.
        positives: per query, an ``int64`` array of database indices that count as correct
            (may be empty: such queries count as failures, as in the standard protocols).
    """

    name: str
    database_paths: tuple[Path, ...]
    query_paths: tuple[Path, ...]
    positives: tuple[np.ndarray, ...]

    def __post_init__(self) -> None:
        if len(self.positives) != len(self.query_paths):
            raise ValueError(f"{self.name}: {len(self.query_paths)} queries but {len(self.positives)} positive lists")

    @property
    def num_database(self) -> int:
        return len(self.database_paths)

    @property
    def num_queries(self) -> int:
        return len(self.query_paths)

    @property
    def queries_without_positive(self) -> int:
        return sum(1 for p in self.positives if len(p) == 0)


class ImageListDataset(Dataset):
    """Images read lazily from a list of paths: ``index -> (image [3, H, W], index)``."""

    def __init__(self, paths: Sequence[Path | str], transform: Callable[[np.ndarray], torch.Tensor]) -> None:
        self.paths = list(paths)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.transform(read_rgb(self.paths[index])), index
