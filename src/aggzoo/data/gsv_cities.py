"""GSV-Cities training data: P places x K images per batch.

A. Ali-bey, B. Chaib-draa, P. Giguere, "GSV-Cities: Toward Appropriate Supervised Visual Place
Recognition", Neurocomputing 2022, arXiv:2210.10239 (amaralibey/gsv-cities, MIT).

Layout (REFERENCE.md section 4)::

    <root>/Dataframes/<City>.csv   columns place_id,year,month,northdeg,city_id,lat,lon,panoid
    <root>/Images/<city_id>/<city_id>_<place_id:07d>_<year:04d>_<month:02d>_<northdeg:03d>_<lat>_<lon>_<panoid>.jpg

One item is one place: ``K`` of its images ``[K, 3, H, W]`` and its label repeated ``[K]``. A
DataLoader with ``batch_size = P`` then yields ``[P, K, 3, H, W]``.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from aggzoo.data.grouped_images import GroupedImagesDataset
from aggzoo.data.image_policy import ImagePolicy
from aggzoo.errors import DatasetFormatError, DatasetLayoutError

__all__ = ["GSVCitiesDataset", "GSVImage", "gsv_image_name", "read_gsv_city"]

PLACE_ID_STRIDE = 10**5  # place ids are made unique across cities by adding city_index * 10^5 (upstream)

_COLUMNS = ("place_id", "year", "month", "northdeg", "city_id", "lat", "lon", "panoid")
_LAYOUT = (
    "expected GSV-Cities layout:\n"
    "  <root>/Dataframes/<City>.csv  (columns: place_id,year,month,northdeg,city_id,lat,lon,panoid)\n"
    "  <root>/Images/<city_id>/<city_id>_<place_id:07d>_<year:04d>_<month:02d>_<northdeg:03d>_<lat>_<lon>_<panoid>.jpg"
)


@dataclass(frozen=True)
class GSVImage:
    """One CSV row: an image of a place."""

    place_id: int
    year: int
    month: int
    path: Path
    lat: float = math.nan  # degrees (the CSV's lat/lon; clique mining's geometry)
    lon: float = math.nan


def gsv_image_name(row: dict[str, str]) -> str:
    """File name of a CSV row. ``lat``/``lon``/``panoid`` are used verbatim, as upstream formats
    them from the CSV text."""
    return (f"{row['city_id']}_{int(row['place_id']) % PLACE_ID_STRIDE:07d}_{int(row['year']):04d}_"
            f"{int(row['month']):02d}_{int(row['northdeg']):03d}_{row['lat']}_{row['lon']}_{row['panoid']}.jpg")


def read_gsv_city(root: Path, city: str, city_index: int) -> list[GSVImage]:
    """Rows of ``Dataframes/<city>.csv`` with place ids made unique across cities."""
    csv_path = root / "Dataframes" / f"{city}.csv"
    if not csv_path.is_file():
        raise DatasetLayoutError(f"GSV-Cities dataframe not found: {csv_path}\n{_LAYOUT}")
    with csv_path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in _COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise DatasetLayoutError(f"{csv_path}: missing columns {missing}\n{_LAYOUT}")
        images = []
        for line, row in enumerate(reader, start=2):
            try:
                place_id = int(row["place_id"]) + city_index * PLACE_ID_STRIDE
                images.append(GSVImage(place_id, int(row["year"]), int(row["month"]),
                                       root / "Images" / row["city_id"] / gsv_image_name(row),
                                       float(row["lat"]), float(row["lon"])))
            except (TypeError, ValueError) as err:
                raise DatasetFormatError(f"{csv_path}, line {line}: malformed row {row} ({err})") from err
    return images


class GSVCitiesDataset(GroupedImagesDataset):
    """Places of one or more GSV-Cities cities, each giving ``img_per_place`` images.

    Args:
        root: dataset folder holding ``Dataframes/`` and ``Images/``.
        cities: city names (CSV stems); ``None`` takes every CSV in ``Dataframes/``.
        img_per_place: ``K`` images returned per place (4 in the paper; 2 works, e.g. two seasons).
        min_img_per_place: places with fewer images are dropped (defaults to ``img_per_place``).
        random_sample_from_each_place: draw K images at random each epoch (upstream default) or
            take the K most recent ones.
        transform: ``rgb uint8 [H, W, 3] -> [3, H', W']``.
        seed: base seed of the per-place image draws; with :meth:`set_epoch` the draw is a pure
            function of ``(seed, epoch, place)``, so an interrupted run resumes with the same data.
        bad_images: ``"skip"`` (default) or ``"fail"``, or an
            :class:`~aggzoo.data.image_policy.ImagePolicy` that also lists skipped files. Under
            ``skip`` an unreadable image is replaced by another image of its place (the next one of
            a seeded order, so the batch stays a pure function of seed, epoch, index and the set of
            bad files, whatever the number of loader workers); a place left with fewer than K
            readable images is replaced by the next place (by index) that has K.

    Raises:
        DatasetLayoutError: missing folders/CSVs, or CSV rows naming files that do not exist.
    """

    def __init__(
        self,
        root: str | Path,
        *,
        cities: Sequence[str] | None = None,
        img_per_place: int = 4,
        min_img_per_place: int | None = None,
        random_sample_from_each_place: bool = True,
        transform: Callable[[np.ndarray], torch.Tensor] | None = None,
        seed: int = 0,
        bad_images: ImagePolicy | str = "skip",
    ) -> None:
        self.root = Path(root)
        if not (self.root / "Dataframes").is_dir() or not (self.root / "Images").is_dir():
            raise DatasetLayoutError(f"GSV-Cities folder {self.root} lacks Dataframes/ or Images/\n{_LAYOUT}")
        if cities is None:
            cities = sorted(p.stem for p in (self.root / "Dataframes").glob("*.csv"))
            if not cities:
                raise DatasetLayoutError(f"no CSV files in {self.root / 'Dataframes'}\n{_LAYOUT}")
        if img_per_place < 2:
            raise ValueError(f"img_per_place must be >= 2 (a place needs a positive pair), got {img_per_place}")
        self.cities = list(cities)
        self.min_img_per_place = img_per_place if min_img_per_place is None else min_img_per_place
        if self.min_img_per_place < img_per_place:
            raise ValueError("min_img_per_place must be >= img_per_place")

        by_place: dict[int, list[GSVImage]] = {}
        for index, city in enumerate(self.cities):
            for image in read_gsv_city(self.root, city, index):
                by_place.setdefault(image.place_id, []).append(image)
        missing = [img.path for imgs in by_place.values() for img in imgs if not img.path.is_file()]
        if missing:
            shown = "\n  ".join(str(p) for p in missing[:5])
            raise DatasetLayoutError(
                f"{len(missing)} images listed in {self.root / 'Dataframes'} do not exist, e.g.:\n  {shown}\n{_LAYOUT}")
        # Most recent first, so the deterministic draw takes the newest K images.
        places = {pid: sorted(imgs, key=lambda i: (i.year, i.month), reverse=True)
                  for pid, imgs in by_place.items() if len(imgs) >= self.min_img_per_place}
        if not places:
            raise DatasetLayoutError(
                f"no place in {self.root} has at least {self.min_img_per_place} images; lower img_per_place")
        super().__init__(places, img_per_place=img_per_place,
                         random_sample_from_each_place=random_sample_from_each_place, transform=transform,
                         seed=seed, bad_images=bad_images)

    def keep_places(self, place_ids: Sequence[int]) -> None:
        """Keep only these places (e.g. the training side of :func:`aggzoo.data.place_split.hold_out_places`)."""
        unknown = sorted(set(int(p) for p in place_ids) - set(self.places))
        if unknown:
            raise ValueError(f"place ids {unknown[:5]} are not places of {self.root}")
        kept = sorted(int(p) for p in place_ids)
        self.places = {pid: self.places[pid] for pid in kept}
        self.place_ids = np.array(kept, dtype=np.int64)

    def describe(self) -> str:
        return str(self.root)
