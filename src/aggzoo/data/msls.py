"""The MSLS layout (Mapillary Street-Level Sequences, Warburg et al., CVPR 2020; mapillary/mapillary_sls, MIT),
image-to-image task, as its official evaluation defines it::

    <root>/train_val/<city>/{query,database}/images/<key>.jpg
                                            /seq_info.csv        key, sequence_key, frame_number (row = frame)
                                            /postprocessed.csv   key, easting, northing, night, view_direction, ...
                                            /raw.csv             key, lon, lat, ca, captured_at, pano
                                            /subtask_index.csv   all, s2w, w2s, o2n, n2o, d2n, n2d (booleans)
    <root>/test/<city>/{query,database}/images/, seq_info.csv, subtask_index.csv   (no coordinates)

Protocol (mapillary_sls ``MSLS(mode="val", task="im2im")`` + ``evaluate.py``): per city, keep the frames of
the subtask, drop panoramas (``raw.csv`` ``pano``), take positives as database images within 25 m
(UTM easting/northing), and evaluate only queries with at least one positive. Cities are concatenated
(one database for all). Validation cities: ``cph`` and ``sf``; the test cities have no coordinates, so
their :class:`RetrievalSet` has no positives and serves the challenge submission
(:func:`aggzoo.evaluation.submission.write_msls_submission`).
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from aggzoo.data.layout import positives_within_radius, require_dir, require_file
from aggzoo.data.retrieval_set import RetrievalSet
from aggzoo.errors import DatasetFormatError

__all__ = ["MSLS_LAYOUT", "MSLS_SOURCE", "MSLS_VAL_CITIES", "MSLS_TEST_CITIES", "load_msls"]

MSLS_LAYOUT = ("<root>/{train_val|test}/<city>/{query,database}/images/<key>.jpg with seq_info.csv, "
               "subtask_index.csv (+ postprocessed.csv, raw.csv in train_val)")
MSLS_SOURCE = ("https://www.mapillary.com/dataset/places (request access; unzip images_vol_*.zip and metadata.zip "
               "together)")
MSLS_VAL_CITIES = ("cph", "sf")
MSLS_TEST_CITIES = ("miami", "athens", "buenosaires", "stockholm", "bengaluru", "kampala")
_SUBTASKS = ("all", "s2w", "w2s", "o2n", "n2o", "d2n", "n2d")


def _read_csv(path: Path) -> list[dict[str, str]]:
    require_file(path, "MSLS metadata file", MSLS_LAYOUT, MSLS_SOURCE)
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    return rows


def _column(rows: list[dict[str, str]], column: str, path: Path) -> list[str]:
    if rows and column not in rows[0]:
        raise DatasetFormatError(f"{path}: no column {column!r} (columns: {sorted(k for k in rows[0] if k)})")
    return [row[column] for row in rows]


def _truthy(values: list[str]) -> np.ndarray:
    return np.array([v.strip().lower() in ("true", "1", "1.0") for v in values], dtype=bool)


def _frame_index(rows: list[dict[str, str]]) -> np.ndarray:
    # The unnamed first column is the frame index (pandas' index_col=0).
    first = next(iter(rows[0])) if rows else ""
    return np.array([int(float(row[first])) for row in rows], dtype=np.int64)


def _side(folder: Path, subtask: str, with_coordinates: bool, exclude_panoramas: bool) -> tuple[list[Path], np.ndarray]:
    """Kept image paths of one city side and, when available, their ``[n, 2]`` UTM coordinates."""
    seq_path, sub_path = folder / "seq_info.csv", folder / "subtask_index.csv"
    keys = _column(_read_csv(seq_path), "key", seq_path)
    subtask_rows = _read_csv(sub_path)
    in_subtask = _truthy(_column(subtask_rows, subtask, sub_path))
    if with_coordinates:
        post_path, raw_path = folder / "postprocessed.csv", folder / "raw.csv"
        post = _read_csv(post_path)
        frames = _frame_index(post)
        utm = np.array([[float(e), float(n)] for e, n in zip(_column(post, "easting", post_path),
                                                               _column(post, "northing", post_path))]).reshape(-1, 2)
        keep = in_subtask[frames]
        if exclude_panoramas:
            keep &= ~_truthy(_column(_read_csv(raw_path), "pano", raw_path))[frames]
    else:
        frames = _frame_index(subtask_rows)
        utm = np.zeros((len(frames), 2))
        keep = in_subtask[frames]
    if len(keys) < (frames.max() + 1 if len(frames) else 0):
        raise DatasetFormatError(f"{seq_path}: {len(keys)} rows, but frame {frames.max()} is referenced")
    paths = [folder / "images" / f"{keys[f]}.jpg" for f in frames[keep]]
    return paths, utm[keep]


def load_msls(
    root: str | Path,
    *,
    cities: Sequence[str] = MSLS_VAL_CITIES,
    split: str = "train_val",
    subtask: str = "all",
    positive_radius_m: float = 25.0,
    exclude_panoramas: bool = True,
    drop_queries_without_positive: bool = True,
    name: str | None = None,
    source: str = MSLS_SOURCE,
) -> RetrievalSet:
    """Load MSLS (im2im) for ``cities``.

    Args:
        root: the folder holding ``train_val/`` and ``test/``.
        cities: city folders, concatenated in this order (default the validation cities cph, sf).
        split: ``train_val`` (with coordinates and positives) or ``test`` (challenge: no positives).
        subtask: ``all`` or a seasonal/day-night subset (``s2w``, ``w2s``, ``o2n``, ``n2o``, ``d2n``, ``n2d``).
        drop_queries_without_positive: the official evaluation scores only queries with a positive.
    """
    if subtask not in _SUBTASKS:
        raise ValueError(f"subtask must be one of {_SUBTASKS}, got {subtask!r}")
    root = Path(root)
    require_dir(root, "MSLS root", MSLS_LAYOUT, source)
    with_coordinates = split != "test"
    db_paths: list[Path] = []
    q_paths: list[Path] = []
    positives: list[np.ndarray] = []
    for city in cities:
        city_dir = require_dir(root / split / city, f"MSLS city folder ({split}/{city})", MSLS_LAYOUT, source)
        db_dir = require_dir(city_dir / "database", "MSLS database folder", MSLS_LAYOUT, source)
        q_dir = require_dir(city_dir / "query", "MSLS query folder", MSLS_LAYOUT, source)
        city_db, db_xy = _side(db_dir, subtask, with_coordinates, exclude_panoramas)
        city_q, q_xy = _side(q_dir, subtask, with_coordinates, exclude_panoramas)
        # Per city, as the official code does: UTM coordinates of different zones are not comparable.
        if with_coordinates:
            city_pos = [p + len(db_paths) for p in positives_within_radius(db_xy, q_xy, positive_radius_m)]
        else:
            city_pos = [np.empty(0, dtype=np.int64) for _ in city_q]
        for path, pos in zip(city_q, city_pos):
            if len(pos) or not (with_coordinates and drop_queries_without_positive):
                q_paths.append(path)
                positives.append(pos)
        db_paths.extend(city_db)
    default_name = f"msls_{'test' if split == 'test' else 'val'}" + ("" if subtask == "all" else f"_{subtask}")
    return RetrievalSet(name=name or default_name, database_paths=tuple(db_paths), query_paths=tuple(q_paths),
                        positives=tuple(positives))
