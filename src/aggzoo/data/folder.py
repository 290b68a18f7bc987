"""Your own images: a folder and one CSV that says which image is a query, which is in the database,
and where each was taken::

    <root>/images.csv       path,role,place               (same place id = positive)
                            path,role,lat,lon             (positive = within positive_radius_m, great-circle)
                            path,role,east,north          (positive = within positive_radius_m, metric coordinates)
    <root>/<path>           the images, paths relative to <root>

``role`` is ``database`` or ``query`` (also accepted: ``db``/``ref``/``reference``, ``q``/``queries``).
Rows keep their CSV order, so database index ``i`` is the ``i``-th database row. A query whose place is
not in the database, or with no database image within the radius, has no positive (counted as a miss).
Latitude/longitude are compared on a sphere of radius 6,371,008.8 m (the IUGG mean Earth radius): the
error against the ellipsoid is below 0.5 %, i.e. under 13 cm at 25 m.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

import numpy as np

from aggzoo.data.layout import positives_within_radius, require_dir, require_file
from aggzoo.data.retrieval_set import RetrievalSet
from aggzoo.errors import DatasetFormatError

__all__ = ["FOLDER_LAYOUT", "EARTH_RADIUS_M", "lat_lon_to_ecef", "load_folder"]

FOLDER_LAYOUT = ("<root>/<csv> with a header 'path,role,place' or 'path,role,lat,lon' or 'path,role,east,north' "
                 "(role = database | query) and the images at <root>/<path>")
EARTH_RADIUS_M = 6_371_008.8
_ROLES = {"database": "database", "db": "database", "ref": "database", "reference": "database",
          "query": "query", "queries": "query", "q": "query"}


def lat_lon_to_ecef(lat_lon_deg: np.ndarray) -> np.ndarray:
    """``[n, 2]`` degrees -> ``[n, 3]`` points on the sphere (metres); chord length ~ ground distance."""
    lat, lon = np.radians(np.asarray(lat_lon_deg, dtype=np.float64)).T
    return EARTH_RADIUS_M * np.stack([np.cos(lat) * np.cos(lon), np.cos(lat) * np.sin(lon), np.sin(lat)], axis=1)


def _float(value: str, column: str, csv_path: Path, line: int) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise DatasetFormatError(
            f"{csv_path}, line {line}: column {column!r} must be a number, got {value!r}") from None


def load_folder(
    root: str | Path,
    *,
    csv_file: str = "images.csv",
    positive_radius_m: float = 25.0,
    name: str | None = None,
    check_images: bool = True,
) -> RetrievalSet:
    """Load a folder of images described by a CSV (see the module docstring for the columns).

    Args:
        root: the folder; image paths in the CSV are relative to it.
        csv_file: the CSV's name inside ``root`` (or an absolute path).
        positive_radius_m: used with coordinates (``lat,lon`` or ``east,north``); ignored with ``place``.
        check_images: fail now, naming the file, when a listed image does not exist.
    """
    root = Path(root)
    source = "your own images (see aggzoo.data.folder for the CSV format)"
    require_dir(root, "image folder", FOLDER_LAYOUT.replace("<csv>", csv_file), source)
    csv_path = require_file(root / csv_file, "image list", FOLDER_LAYOUT.replace("<csv>", csv_file), source)
    with csv_path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        columns = [c.strip() for c in reader.fieldnames or []]
        rows = [{(k or "").strip(): (v or "").strip() for k, v in row.items()} for row in reader]
    if "path" not in columns or "role" not in columns:
        raise DatasetFormatError(
            f"{csv_path}: needs columns 'path' and 'role', found {columns}. Expected {FOLDER_LAYOUT}")
    if "place" in columns:
        kind = "place"
    elif {"lat", "lon"} <= set(columns):
        kind = "latlon"
    elif {"east", "north"} <= set(columns):
        kind = "metric"
    else:
        raise DatasetFormatError(f"{csv_path}: needs 'place', or 'lat,lon', or 'east,north' columns; found {columns}")

    db_paths: list[Path] = []
    q_paths: list[Path] = []
    db_keys: list = []
    q_keys: list = []
    for line, row in enumerate(rows, start=2):
        role = _ROLES.get(row["role"].lower())
        if role is None:
            raise DatasetFormatError(
                f"{csv_path}, line {line}: role must be 'database' or 'query', got {row['role']!r}")
        path = root / row["path"]
        if check_images and not path.is_file():
            raise DatasetFormatError(f"{csv_path}, line {line}: image not found: {path}")
        if kind == "place":
            key = row["place"]
        elif kind == "latlon":
            key = (_float(row["lat"], "lat", csv_path, line), _float(row["lon"], "lon", csv_path, line))
        else:
            key = (_float(row["east"], "east", csv_path, line), _float(row["north"], "north", csv_path, line))
        (db_paths if role == "database" else q_paths).append(path)
        (db_keys if role == "database" else q_keys).append(key)
    if not db_paths or not q_paths:
        raise DatasetFormatError(f"{csv_path}: needs at least one 'database' and one 'query' row "
                                 f"(found {len(db_paths)} and {len(q_paths)})")

    if kind == "place":
        by_place: dict[str, list[int]] = defaultdict(list)
        for i, place in enumerate(db_keys):
            by_place[place].append(i)
        positives = tuple(np.asarray(by_place.get(p, []), dtype=np.int64) for p in q_keys)
    elif kind == "latlon":
        # Ground distance d <-> chord 2R sin(d / 2R): the radius search on 3-D points is exact on the sphere.
        chord = 2 * EARTH_RADIUS_M * np.sin(positive_radius_m / (2 * EARTH_RADIUS_M))
        positives = positives_within_radius(lat_lon_to_ecef(np.array(db_keys)), lat_lon_to_ecef(np.array(q_keys)),
                                            chord)
    else:
        positives = positives_within_radius(np.array(db_keys), np.array(q_keys), positive_radius_m)
    return RetrievalSet(name=name or root.name, database_paths=tuple(db_paths), query_paths=tuple(q_paths),
                        positives=positives)
