"""Class-balanced training items: ``m`` images of one class per item, from a :class:`ClassLabelledImages`.

The class-balanced sampling of landmark retrieval and deep metric learning ("m images per class per
batch": P classes x m images) is the P x K place batch of VPR with a class in place of a place. One
item of :class:`ClassImagesDataset` is one class's ``m`` images ``[m, 3, H, W]`` with its label
repeated ``[m]``; :class:`~aggzoo.training.samplers.PlaceBatchSampler` then puts ``P`` classes in every
step, with the same ``(seed, epoch)`` permutation, rank sharding and mid-epoch resume as for places.

Labels are dense: the classes kept (those with at least ``min_img_per_class`` images) are numbered
``0 .. C-1`` in the order of their source ids, so a classification loss (ArcFace, CosFace) can index
its class weights with them; :attr:`ClassImagesDataset.class_ids` maps them back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from aggzoo.data.class_labelled import ClassLabelledImages
from aggzoo.data.grouped_images import GroupedImagesDataset
from aggzoo.data.image_policy import ImagePolicy
from aggzoo.errors import DatasetLayoutError

__all__ = ["ClassImage", "ClassImagesDataset"]


@dataclass(frozen=True)
class ClassImage:
    """One training image: its file (the record a group holds)."""

    path: Path


class ClassImagesDataset(GroupedImagesDataset):
    """The classes of a class-labelled set, each item giving ``img_per_class`` of a class's images.

    Args:
        images: the set (``aggzoo.data.gldv2.read_gldv2_clean``, ``aggzoo.data.class_folder.read_class_folder``,
            :func:`aggzoo.data.synthetic_landmarks.read_synthetic_landmark_ids`, ...).
        img_per_class: ``m`` images per class and item (>= 2: a class needs a positive pair).
        min_img_per_class: classes with fewer images are left out (defaults to ``img_per_class``; the
            draw is without replacement).
        random_sample_from_each_class: draw m images at random each epoch, or take the first m in
            the reader's order.
        transform, seed, bad_images: as :class:`~aggzoo.data.grouped_images.GroupedImagesDataset`.

    Raises:
        DatasetLayoutError: no class has ``min_img_per_class`` images, or listed files do not exist.
    """

    group_name = "class"

    def __init__(self, images: ClassLabelledImages, *, img_per_class: int = 4, min_img_per_class: int | None = None,
                 random_sample_from_each_class: bool = True,
                 transform: Callable[[np.ndarray], torch.Tensor] | None = None, seed: int = 0,
                 bad_images: ImagePolicy | str = "skip") -> None:
        if img_per_class < 2:
            raise ValueError(f"img_per_class must be >= 2 (a class needs a positive pair), got {img_per_class}")
        minimum = img_per_class if min_img_per_class is None else min_img_per_class
        if minimum < img_per_class:
            raise ValueError("min_img_per_class must be >= img_per_class")
        missing = [p for p in images.paths if not Path(p).is_file()]
        if missing:
            shown = "\n  ".join(str(p) for p in missing[:5])
            raise DatasetLayoutError(f"{len(missing)} images of {images.name} do not exist, e.g.:\n  {shown}")
        kept = {c: idx for c, idx in images.indices_by_class().items() if len(idx) >= minimum}
        if not kept:
            raise DatasetLayoutError(f"no class of {images.name} has at least {minimum} images; lower "
                                     "data.img_per_class (the images per class in a batch)")
        self.name = images.name
        self.min_img_per_class = minimum
        #: ``[C]`` the source class id of every dense label
        self.class_ids = np.array(sorted(kept), dtype=np.int64)
        places = {label: [ClassImage(Path(images.paths[i])) for i in kept[int(c)]]
                  for label, c in enumerate(self.class_ids)}
        super().__init__(places, img_per_place=img_per_class, random_sample_from_each_place=random_sample_from_each_class,
                         transform=transform, seed=seed, bad_images=bad_images)

    @property
    def num_classes(self) -> int:
        """``C``, the range of the labels (what a classification loss sizes its class weights by)."""
        return len(self.class_ids)

    def describe(self) -> str:
        return self.name
