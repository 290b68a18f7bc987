"""What every evaluation format loads into: database and query images with their ground truth.

The ground truth of a query is its positives and, in the image-retrieval protocols (revisited
Oxford / Paris), its *junk*: database images that are neither right nor wrong and are removed from
the ranking before it is scored. A benchmark may carry several named ground truths over the same
images (revisitop's Easy / Medium / Hard setups), a box per query (the query is the cropped region)
and the names of the metrics its community reports. Metric *names* only: this layer cannot import
:mod:`aggzoo.evaluation`, which maps them to metric functions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import numpy as np
import torch
from torch.utils.data import Dataset

from aggzoo.data.images import read_rgb
from aggzoo.errors import DatasetFormatError

__all__ = ["Box", "GroundTruth", "RetrievalSet", "ImageListDataset", "crop_to_box"]

#: ``(x1, y1, x2, y2)`` in pixels, zero-based, ``x2``/``y2`` exclusive after rounding (PIL's ``crop``).
Box = tuple[float, float, float, float]


def _check_lengths(owner: str, num_queries: int, **lists: Sequence | None) -> None:
    for what, values in lists.items():
        if values is not None and len(values) != num_queries:
            raise ValueError(f"{owner}: {num_queries} queries but {len(values)} {what} lists")


@dataclass(frozen=True)
class GroundTruth:
    """One ground truth over a benchmark's queries.

    Attributes:
        positives: per query, ``int64`` database indices that count as correct.
        junk: per query, database indices removed from the ranking before scoring (neither correct
            nor wrong); ``None`` when the benchmark has no junk.
    """

    positives: tuple[np.ndarray, ...]
    junk: tuple[np.ndarray, ...] | None = None

    def __post_init__(self) -> None:
        _check_lengths("GroundTruth", len(self.positives), junk=self.junk)

    @property
    def num_queries(self) -> int:
        return len(self.positives)


def _check_box(box: Box | None, q: int, name: str) -> None:
    if box is None:
        return
    values = np.asarray(box, dtype=np.float64)
    if values.shape != (4,) or not np.isfinite(values).all() or values[2] <= values[0] or values[3] <= values[1]:
        raise DatasetFormatError(
            f"{name}: the box of query {q} is {tuple(box)}; a query box is [x1, y1, x2, y2] in pixels with "
            "x2 > x1 and y2 > y1"
        )


@dataclass(frozen=True)
class RetrievalSet:
    """A retrieval benchmark in memory: paths and ground truth, never pixels.

    Attributes:
        name: benchmark name used in reports.
        database_paths: ``N_db`` image paths.
        query_paths: ``N_q`` image paths.
        positives: per query, an ``int64`` array of database indices that count as correct
            (may be empty: such queries count as failures in Recall@k, and are left out of mAP).
        junk: per query, database indices ignored in the ranking (revisitop's junk); ``None``: none.
        query_boxes: per query, ``(x1, y1, x2, y2)`` zero-based pixels (or ``None`` for the whole
            image): the query is this crop of its image, taken before the transform.
        setups: named alternative ground truths over the same images (revisitop: ``"easy"``,
            ``"medium"``, ``"hard"``); ``positives``/``junk`` are the default one (Medium).
        metrics: names of the metrics the benchmark's community reports: ``"recall"`` (Recall@k,
            place recognition), ``"map"`` and ``"mp"`` (mAP and mP@k, revisited Oxford / Paris),
            ``"map_at_r"`` and ``"r_precision"`` (MAP@R and R-Precision, metric learning).
        distractors: how many of the database's last images are distractors appended from a list other
            benchmarks share (the revisitop 1M): never positive or junk; their descriptors can be cached
            across benchmarks (:mod:`aggzoo.evaluation.descriptor_cache`).
        queries_are_database: the queries are the database images themselves (query ``q`` is database image
            ``q``; ``query_paths == database_paths``), the metric-learning protocol: descriptors are extracted
            once and each query's own image is removed from its results (by index), so it is searched against
            the ``N_db - 1`` others.
    """

    name: str
    database_paths: tuple[Path, ...]
    query_paths: tuple[Path, ...]
    positives: tuple[np.ndarray, ...]
    junk: tuple[np.ndarray, ...] | None = None
    query_boxes: tuple[Box | None, ...] | None = None
    setups: Mapping[str, GroundTruth] | None = None
    metrics: tuple[str, ...] = ("recall",)
    distractors: int = 0
    queries_are_database: bool = False

    def __post_init__(self) -> None:
        owner, num_queries = self.name, len(self.query_paths)
        if self.queries_are_database and (self.query_paths != self.database_paths or self.query_boxes is not None
                                          or self.distractors or num_queries < 2):
            raise ValueError(f"{owner}: queries_are_database needs the same paths as queries and as database, at "
                             "least two of them, no query box and no distractor")
        if not 0 <= self.distractors <= len(self.database_paths):
            raise ValueError(f"{owner}: distractors must count database images (0..{len(self.database_paths)}), "
                             f"got {self.distractors}")
        _check_lengths(owner, num_queries, positive=self.positives, junk=self.junk, box=self.query_boxes)
        for q, box in enumerate(self.query_boxes or ()):
            _check_box(box, q, owner)
        if self.setups is not None:
            for setup, truth in self.setups.items():
                if not isinstance(truth, GroundTruth):
                    raise TypeError(f"{owner}: setup {setup!r} is a {type(truth).__name__}, not a GroundTruth")
                _check_lengths(f"{owner} setup {setup!r}", num_queries, positive=truth.positives, junk=truth.junk)
            # A read-only view: the set is frozen, so its setups must not change under it either.
            object.__setattr__(self, "setups", MappingProxyType(dict(self.setups)))
        metrics = (self.metrics,) if isinstance(self.metrics, str) else tuple(self.metrics)
        if not metrics or not all(isinstance(m, str) and m for m in metrics):
            raise ValueError(f"{owner}: metrics must be a non-empty tuple of names, got {self.metrics!r}")
        object.__setattr__(self, "metrics", metrics)

    @property
    def num_database(self) -> int:
        return len(self.database_paths)

    @property
    def num_queries(self) -> int:
        return len(self.query_paths)

    @property
    def image_paths(self) -> tuple[Path, ...]:
        """Every image to read once: the database's, then the queries' (none more when they are the database)."""
        return self.database_paths if self.queries_are_database else (*self.database_paths, *self.query_paths)

    @property
    def num_candidates(self) -> int:
        """How many database images a query is ranked against (its own image left out when
        ``queries_are_database``)."""
        return self.num_database - int(self.queries_are_database)

    @property
    def queries_without_positive(self) -> int:
        return sum(1 for p in self.positives if len(p) == 0)

    @property
    def ground_truth(self) -> GroundTruth:
        """The default ground truth (``positives`` and ``junk``) as one value."""
        return GroundTruth(self.positives, self.junk)


def crop_to_box(image: np.ndarray, box: Box) -> np.ndarray:
    """The region ``box`` of ``image [H, W, C]``: ``[H', W', C]``, contiguous (as the transforms expect).

    The box is rounded as revisitop's and cirtorch's Python code crops query images (PIL's
    ``Image.crop(bbx)`` with a float box: each coordinate ``round()``-ed, half to even, and
    ``x2``/``y2`` exclusive), then clamped to the image where PIL would pad with black (the MATLAB
    code, ``crop_qim.m``, clamps). The MATLAB code keeps one more row and column (inclusive end).

    Raises:
        ValueError: the box lies outside the image (nothing left after clamping).
    """
    height, width = image.shape[:2]
    x1, y1, x2, y2 = (int(round(float(v))) for v in box)
    x1, x2 = max(0, min(x1, width)), max(0, min(x2, width))
    y1, y2 = max(0, min(y1, height)), max(0, min(y2, height))
    if x2 <= x1 or y2 <= y1:
        raise ValueError(f"the box {tuple(box)} lies outside the {width}x{height} image")
    return np.ascontiguousarray(image[y1:y2, x1:x2])


class ImageListDataset(Dataset):
    """Images read lazily from a list of paths: ``index -> (image [3, H, W], index)``.

    ``boxes``: per item, ``(x1, y1, x2, y2)`` or ``None``; a boxed image is cropped to its box
    (:func:`crop_to_box`) before ``transform``, as the revisited Oxford / Paris queries are.
    """

    def __init__(
        self,
        paths: Sequence[Path | str],
        transform: Callable[[np.ndarray], torch.Tensor],
        boxes: Sequence[Box | None] | None = None,
    ) -> None:
        self.paths = list(paths)
        self.transform = transform
        self.boxes = None if boxes is None else list(boxes)
        if self.boxes is not None and len(self.boxes) != len(self.paths):
            raise ValueError(f"{len(self.paths)} images but {len(self.boxes)} boxes")

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = read_rgb(self.paths[index])
        box = None if self.boxes is None else self.boxes[index]
        if box is not None:
            full_size = image.shape[:2]
            try:
                image = crop_to_box(image, box)
            except ValueError as err:
                raise DatasetFormatError(f"{self.paths[index]}: cannot crop the query: {err}") from None
            if getattr(self.transform, "scales_crops_as_full_image", False):
                # a long-side protocol scales a crop by its full image's factor (cirtorch's ImagesFromList)
                return self.transform(image, full_size=full_size), index
        return self.transform(image), index
