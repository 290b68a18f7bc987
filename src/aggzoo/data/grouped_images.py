"""Training items that are groups of images: ``K`` images of one place (GSV-Cities) or of one class
(landmarks, metric-learning sets), drawn afresh every epoch.

:class:`GroupedImagesDataset` holds the part the two share: the per-epoch draw of ``K`` images of a
group as a pure function of ``(seed, epoch, item)``, the replacement of unreadable images under the
``bad_images`` policy, and the item ``[K, 3, H, W]`` with its label repeated ``[K]``. A subclass only
builds :attr:`places` (group id -> its images, each with a ``path``). The batch machinery of
:mod:`aggzoo.training.samplers` (P groups per step, mid-epoch resume) then serves any subclass.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from torch.utils.data import Dataset

from aggzoo.data.image_policy import ImagePolicy
from aggzoo.data.images import ImageReadError

__all__ = ["GroupedImagesDataset", "HasPath"]


class HasPath(Protocol):
    """An image record: anything with a ``path``."""

    path: Path


class GroupedImagesDataset(Dataset):
    """Groups of images, each item giving ``img_per_place`` of them.

    Args:
        places: group id -> its images (records with a ``path``), in the order the deterministic draw
            (``random_sample_from_each_place=False``) takes them. Group ids are sorted here.
        img_per_place: ``K`` images returned per item.
        random_sample_from_each_place: draw K images at random each epoch, or take the first K.
        transform: ``rgb uint8 [H, W, 3] -> [3, H', W']``.
        seed: base seed of the per-group image draws; with :meth:`set_epoch` the draw is a pure
            function of ``(seed, epoch, item)``, so an interrupted run resumes with the same data.
        bad_images: ``"skip"`` (default) or ``"fail"``, or an :class:`~aggzoo.data.image_policy.ImagePolicy`.
            Under ``skip`` an unreadable image is replaced by another image of its group (the next one
            of a seeded order); a group left with fewer than K readable images is replaced by the next
            group (by index) that has K.
    """

    def __init__(self, places: Mapping[int, Sequence[HasPath]], *, img_per_place: int,
                 random_sample_from_each_place: bool = True,
                 transform: Callable[[np.ndarray], torch.Tensor] | None = None, seed: int = 0,
                 bad_images: ImagePolicy | str = "skip") -> None:
        self.places = {int(pid): list(images) for pid, images in sorted(places.items())}
        self.place_ids = np.array(list(self.places), dtype=np.int64)
        self.img_per_place = img_per_place
        self.random_sample_from_each_place = random_sample_from_each_place
        self.transform = transform
        self.seed = seed
        self.epoch = 0
        self.bad_images = ImagePolicy.coerce(bad_images)

    #: what one item is called in messages ("place", "class")
    group_name = "place"

    @property
    def num_images(self) -> int:
        return sum(len(v) for v in self.places.values())

    def set_epoch(self, epoch: int) -> None:
        """Make the next epoch's draws depend on ``epoch`` (called by the training module)."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.place_ids)

    def image_paths(self, index: int) -> list[Path]:
        """The K image paths item ``index`` returns this epoch."""
        images = self.places[int(self.place_ids[index])]
        if self.random_sample_from_each_place:
            rng = np.random.default_rng((self.seed, self.epoch, index))
            chosen = rng.choice(len(images), size=self.img_per_place, replace=False)
            return [images[i].path for i in chosen]
        return [img.path for img in images[: self.img_per_place]]

    def candidate_paths(self, index: int) -> list[Path]:
        """All images of item ``index``'s group: this epoch's K draw first, then the others in a
        seeded order (the replacements for unreadable images)."""
        drawn = self.image_paths(index)
        rest = [img.path for img in self.places[int(self.place_ids[index])] if img.path not in drawn]
        if self.random_sample_from_each_place:
            order = np.random.default_rng((self.seed, self.epoch, index, 1)).permutation(len(rest))
            rest = [rest[i] for i in order]
        return drawn + rest

    def _read_place(self, index: int) -> tuple[list[np.ndarray], list[Path]] | None:
        arrays, used = [], []
        for path in self.candidate_paths(index):
            array = self.bad_images.read(path)
            if array is not None:
                arrays.append(array)
                used.append(path)
                if len(arrays) == self.img_per_place:
                    return arrays, used
        return None

    def item(self, index: int) -> tuple[int, list[np.ndarray], list[Path]]:
        """``(index actually used, K RGB arrays, their paths)`` for item ``index``, after skipping
        unreadable images (and groups) as ``bad_images`` says."""
        for offset in range(len(self)):
            used_index = (index + offset) % len(self)
            found = self._read_place(used_index)
            if found is not None:
                if offset:
                    self.bad_images.record(f"{self.group_name}:{int(self.place_ids[index])}",
                                           f"fewer than {self.img_per_place} readable images; replaced by "
                                           f"{self.group_name} {int(self.place_ids[used_index])}")
                return used_index, *found
        raise ImageReadError(f"no {self.group_name} in {self.describe()} has {self.img_per_place} readable images "
                             f"(skipped files are listed in {self.bad_images.log_path or 'the log'})")

    def describe(self) -> str:
        """The data in messages (a folder, a set's name)."""
        return type(self).__name__

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """-> images ``[K, 3, H, W]``, labels ``[K]`` (the group id)."""
        if self.transform is None:
            raise RuntimeError(f"{type(self).__name__} needs a transform to return tensors")
        used_index, arrays, _ = self.item(index)
        images = torch.stack([self.transform(a) for a in arrays])
        label = torch.full((self.img_per_place,), int(self.place_ids[used_index]), dtype=torch.long)
        return images, label
