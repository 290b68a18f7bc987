"""The VG layout: image folders whose file names carry UTM coordinates.

Used by every dataset that gmberton's VPR-datasets-downloader formats (Pitts30k/250k, MSLS, Tokyo 24/7,
St Lucia, SF-XL, SVOX, AmsterTime, Nordland, SPED, ...) and by aggzoo's synthetic sets::

    <root>/images/<split>/database/@<UTM_east>@<UTM_north>@<zone>@<letter>@<lat>@<lon>@...@.jpg
    <root>/images/<split>/queries/@<UTM_east>@<UTM_north>@...@.jpg

Positives of a query are the database images within ``positive_radius_m`` metres (Euclidean distance
on the first two ``@`` fields, the distance included); 25 m is the protocol of every published number.
SPED and Nordland carry fake UTM coordinates chosen so that the same 25 m radius gives their
frame-based ground truth. Images are listed recursively and sorted by path, so indices are stable.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from aggzoo.data.layout import IMAGE_EXTENSIONS, list_images, positives_within_radius, require_dir
from aggzoo.data.retrieval_set import RetrievalSet
from aggzoo.errors import DatasetFormatError, DatasetLayoutError

__all__ = ["VG_LAYOUT", "VG_SOURCE", "utm_from_name", "load_vg"]

VG_LAYOUT = (
    "<root>/{images_dir}<split>/{database}/@UTM_east@UTM_north@zone@letter@lat@lon@...@.jpg and "
    "<root>/{images_dir}<split>/{queries}/ with the same names"
)
VG_SOURCE = "https://github.com/gmberton/VPR-datasets-downloader (downloads and formats the public VPR datasets)"

# Folder names that say nothing about which dataset it is; skipped when naming a benchmark.
_GENERIC_FOLDERS = {"vg", "images", "processed", "data", "dataset", "datasets"}


def utm_from_name(path: str | Path) -> tuple[float, float]:
    """``(east, north)`` from a VG file name ``@east@north@...``; the error names the file."""
    fields = Path(path).name.split("@")
    try:
        if fields[0] != "" or len(fields) < 4:
            raise ValueError("not of the form @east@north@...")
        east, north = float(fields[1]), float(fields[2])
        if not (np.isfinite(east) and np.isfinite(north)):
            raise ValueError("non-finite coordinate")
    except (IndexError, ValueError) as err:
        raise DatasetFormatError(
            f"{path}: VG image names must start with '@<UTM_east>@<UTM_north>@' (metres), e.g. "
            f"'@585000.12@4477000.56@17@T@....jpg' ({err}). Rename the file or use the folder+CSV format "
            "(aggzoo.data.folder) for images without UTM names."
        ) from None
    return east, north


def _benchmark_name(root: Path, split: str) -> str:
    parts = [p for p in root.resolve().parts if p.lower() not in _GENERIC_FOLDERS]
    return f"{parts[-1] if parts else root.name}_{split}"


def load_vg(
    root: str | Path,
    *,
    split: str = "test",
    positive_radius_m: float = 25.0,
    name: str | None = None,
    database_folder: str = "database",
    queries_folder: str = "queries",
    images_dir: str = "images",
    source: str = VG_SOURCE,
) -> RetrievalSet:
    """Load a VG-layout benchmark with positives by UTM radius.

    Args:
        root: dataset folder holding ``images/`` (e.g. ``.../pitts30k``).
        split: ``train``, ``val`` or ``test``.
        positive_radius_m: a database image within this distance of a query is a positive (25 m in
            every published protocol).
        name: benchmark name in reports; default ``<dataset folder>_<split>``.
        database_folder, queries_folder: sub-folder names (SVOX: ``gallery``; SF-XL: ``queries_v1``,
            ``queries_night``, ...).
        images_dir: folder between ``root`` and the split; ``""`` when the splits sit in ``root``
            (SF-XL's ``processed/test/...``).
        source: where the data is published, quoted when the folder is missing.
    """
    root = Path(root)
    prefix = f"{images_dir}/" if images_dir else ""
    layout = VG_LAYOUT.format(images_dir=prefix, database=database_folder, queries=queries_folder)
    require_dir(root, "dataset root", layout, source)
    split_dir = require_dir(root / images_dir / split, f"split {split!r} folder", layout, source)
    db_dir = require_dir(split_dir / database_folder, "database folder", layout, source)
    q_dir = require_dir(split_dir / queries_folder, "queries folder", layout, source)

    database_paths, query_paths = list_images(db_dir), list_images(q_dir)
    for folder, paths in ((db_dir, database_paths), (q_dir, query_paths)):
        if not paths:
            raise DatasetLayoutError(
                f"no images ({', '.join(IMAGE_EXTENSIONS)}) under {folder}. Expected the VG layout: {layout}."
            )
    positives = positives_within_radius(
        np.array([utm_from_name(p) for p in database_paths]),
        np.array([utm_from_name(p) for p in query_paths]),
        positive_radius_m,
    )
    return RetrievalSet(
        name=name or _benchmark_name(root, split),
        database_paths=database_paths,
        query_paths=query_paths,
        positives=positives,
    )

