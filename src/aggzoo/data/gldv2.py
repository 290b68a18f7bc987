"""Google Landmarks Dataset v2, the clean training subset (GLDv2-clean).

T. Weyand, A. Araujo, B. Cao, J. Sim, "Google Landmarks Dataset v2 - A Large-Scale Benchmark for
Instance-Level Recognition and Retrieval", CVPR 2020, arXiv:2004.01804 (cvdfoundation/google-landmark;
annotations CC BY 4.0). Layout, as the dataset's README publishes it::

    <root>/train_clean.csv                       header landmark_id,images; one row per landmark, its image
                                                 ids separated by spaces
    <root>/train/<a>/<b>/<c>/<id>.jpg            <a>, <b>, <c>: the first three characters of the id
                                                 (the 500 images_NNN.tar archives extracted into train/)

1,580,470 images of 81,313 landmarks (REFERENCE.md section 9).

Filters: the recipes that train on GLDv2-clean apply none beyond the clean list itself. DELG's data
preparation (tensorflow/models research/delf/delf/python/training/build_image_dataset.py,
``_get_clean_train_image_files_and_labels``) keeps every image of ``train_clean.csv`` and renumbers the landmark
ids to ``0 .. C-1`` in sorted order (``np.unique(labels, return_inverse=True)[1]`` is that renumbering; this reader
keeps the source ids, as :class:`ClassLabelledImages` does); its optional train/validation split holds out 20 %
of each landmark. CVNet and SuperGlobal publish no training code to read a filter from. Pair-VPR keeps the
landmarks with at least 4 images (72,322 of them): ``min_images_per_landmark=4``.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import numpy as np

from aggzoo.data.class_labelled import ClassLabelledImages
from aggzoo.data.layout import require_dir, require_file
from aggzoo.errors import DatasetFormatError, DatasetLayoutError

__all__ = ["GLDV2_LAYOUT", "GLDV2_SOURCE", "gldv2_image_path", "landmark_rows", "read_gldv2_clean"]

GLDV2_LAYOUT = ("<root>/train_clean.csv (header landmark_id,images; image ids separated by spaces) and "
                "<root>/train/<a>/<b>/<c>/<id>.jpg (a, b, c: the first three characters of the id)")
GLDV2_SOURCE = ("https://github.com/cvdfoundation/google-landmark (train_clean.csv: "
                "https://s3.amazonaws.com/google-landmark/metadata/train_clean.csv; images: "
                "https://s3.amazonaws.com/google-landmark/train/images_000.tar .. images_499.tar, extracted into train/)")
_ID = re.compile(r"[0-9A-Za-z]{3,}")


def gldv2_image_path(root: Path, image_id: str) -> Path:
    """``<root>/train/<a>/<b>/<c>/<id>.jpg``."""
    return root / "train" / image_id[0] / image_id[1] / image_id[2] / f"{image_id}.jpg"


def landmark_rows(csv_path: Path, layout: str, image_id: re.Pattern = _ID,
                  image_id_rule: str = "letters and digits (3 or more)") -> list[tuple[int, list[str]]]:
    """The rows of a ``landmark_id,images`` CSV (GLDv2's ``train_clean.csv`` format, also the synthetic landmark
    set's ``landmark_ids.csv``): ``[(landmark_id, [image ids])]`` in file order.

    Raises:
        DatasetFormatError: the header is not ``landmark_id,images``, or a row is not ``<int>,<id> <id> ...`` with
            ids matching ``image_id`` (``image_id_rule`` in words); the message names the line and ``layout``.
    """
    rows: list[tuple[int, list[str]]] = []
    with csv_path.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = [c.strip() for c in next(reader, [])]
        if header != ["landmark_id", "images"]:
            raise DatasetFormatError(f"{csv_path}: the header is {header}, expected ['landmark_id', 'images']. "
                                     f"Expected layout: {layout}.")
        for line, row in enumerate(reader, start=2):
            if not row:
                continue
            try:
                landmark, images = int(row[0]), row[1].split()
            except (IndexError, ValueError):
                raise DatasetFormatError(f"{csv_path}, line {line}: expected <landmark_id>,<id> <id> ..., got "
                                         f"{','.join(row)[:200]!r}. Expected layout: {layout}.") from None
            bad = next((i for i in images if not image_id.fullmatch(i)), None)
            if bad is not None or len(row) != 2 or not images:
                raise DatasetFormatError(f"{csv_path}, line {line}: image ids must be {image_id_rule}, got "
                                         f"{bad or row[1:]!r}. Expected layout: {layout}.")
            rows.append((landmark, images))
    return rows


def read_gldv2_clean(
    root: str | Path,
    csv_name: str = "train_clean.csv",
    *,
    min_images_per_landmark: int = 1,
    name: str = "gldv2_clean",
) -> ClassLabelledImages:
    """The images of ``train_clean.csv`` labelled by their ``landmark_id``, in the CSV's order.

    Args:
        root: the folder holding the CSV and ``train/``.
        csv_name: the CSV inside ``root``.
        min_images_per_landmark: landmarks with fewer images are left out (1: none, as DELG; 4: Pair-VPR).
        name: the set's name in reports.

    Only the first and the last image are checked here (1.6 million ``stat`` calls are slow on network
    disks); any other missing image fails when it is read, naming the file.

    Raises:
        DatasetLayoutError: the folder, the CSV, ``train/`` or the first / last image is missing.
        DatasetFormatError: the CSV's header or a row is malformed, or an image id is listed twice.
    """
    root = Path(root)
    require_dir(root, "GLDv2 folder", GLDV2_LAYOUT, GLDV2_SOURCE)
    csv_path = require_file(root / csv_name, "GLDv2-clean list", GLDV2_LAYOUT, GLDV2_SOURCE)
    require_dir(root / "train", "GLDv2 image folder", GLDV2_LAYOUT, GLDV2_SOURCE)
    ids: list[str] = []
    labels: list[int] = []
    for landmark, images in landmark_rows(csv_path, GLDV2_LAYOUT):
        if len(images) >= min_images_per_landmark:
            ids += images
            labels += [landmark] * len(images)
    if not ids:
        raise DatasetFormatError(f"{csv_path}: lists no landmark with at least {min_images_per_landmark} images. "
                                 f"Expected layout: {GLDV2_LAYOUT}.")
    if len(set(ids)) != len(ids):
        repeated = next(i for i, count in zip(*np.unique(ids, return_counts=True)) if count > 1)
        raise DatasetFormatError(f"{csv_path}: image {repeated} is listed more than once (each image has one landmark). "
                                 f"Expected layout: {GLDV2_LAYOUT}.")
    train = str(root / "train")  # one Path per image, built from a string: 1.6 million of them
    paths = tuple(Path(f"{train}/{i[0]}/{i[1]}/{i[2]}/{i}.jpg") for i in ids)
    for path in {paths[0], paths[-1]}:
        if not path.is_file():
            raise DatasetLayoutError(f"image not found: {path} (listed in {csv_path.name}). Expected layout: "
                                     f"{GLDV2_LAYOUT}. Data: {GLDV2_SOURCE}.")
    return ClassLabelledImages(name, paths, np.asarray(labels, dtype=np.int64))
