"""Class-labelled images: the data shape of landmark retrieval and deep metric learning.

Google Landmarks v2 (one landmark id per image), the metric-learning benchmarks (CUB-200-2011,
Cars196, Stanford Online Products, In-shop) and any folder-per-class tree all reduce to a list of
image paths with an integer class each. Readers (``aggzoo.data.gldv2``, ``aggzoo.data.class_folder``,
``aggzoo.data.metric_learning``) return a :class:`ClassLabelledImages`; training samples ``m`` images
per class from it and the metric-learning evaluation searches every image against the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["ClassLabelledImages"]


@dataclass(frozen=True, eq=False)
class ClassLabelledImages:
    """Images and their class ids.

    Attributes:
        name: what the set is called in reports (``"cub200_test"``, ``"gldv2_clean"``).
        paths: one absolute path per image, in the reader's order.
        labels: ``[N]`` int64 class ids as the source numbers them (not necessarily contiguous).
    """

    name: str
    paths: tuple[Path, ...]
    labels: np.ndarray

    def __post_init__(self) -> None:
        labels = np.asarray(self.labels, dtype=np.int64)
        if labels.ndim != 1 or labels.shape[0] != len(self.paths):
            raise ValueError(f"{self.name}: {len(self.paths)} paths but labels of shape {labels.shape}")
        object.__setattr__(self, "labels", labels)

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def classes(self) -> np.ndarray:
        """``[C]`` the distinct class ids, sorted."""
        return np.unique(self.labels)

    def indices_by_class(self) -> dict[int, np.ndarray]:
        """Class id -> ``[n_c]`` indices of its images, in reader order."""
        order = np.argsort(self.labels, kind="stable")
        ids, starts = np.unique(self.labels[order], return_index=True)
        return {int(c): idx for c, idx in zip(ids, np.split(order, starts[1:]), strict=True)}

    def subset(self, keep: np.ndarray, name: str | None = None) -> ClassLabelledImages:
        """The images at ``keep`` (``[M]`` indices or an ``[N]`` boolean mask), in that order."""
        index = np.flatnonzero(keep) if np.asarray(keep).dtype == bool else np.asarray(keep, dtype=np.int64)
        return ClassLabelledImages(name or self.name, tuple(self.paths[i] for i in index), self.labels[index])
