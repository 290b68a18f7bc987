"""Retrieval without ground truth: the top-k database images of each query, their scores, and the
distances in metres when the file names carry coordinates.

``eval.py model=<name> database=<folder> queries=<folder>``: two folders of images (searched
recursively, sorted by path), no CSV and no positives. The output is what a person checks by eye or
feeds to a later step: ``predictions.csv`` (one row per query and rank), ``predictions.json`` (the
same with the run's settings) and ``predictions.png`` (the retrieval grid of
:func:`aggzoo.evaluation.report.plot_predictions`).

Coordinates are read from the names of the public datasets' layouts (REFERENCE.md section 4):

- VG (``@UTM_east@UTM_north@zone@letter@lat@lon@...@.jpg``, gmberton's VPR-datasets-downloader): the
  first two fields, metres; the distance is Euclidean on them, as the VG ground truth uses.
- GSV-Cities (``<city>_<place>_<year>_<month>_<northdeg>_<lat>_<lon>_<panoid>.jpg``): latitude and
  longitude in degrees; the distance is great-circle on the sphere of :mod:`aggzoo.data.folder`.

Distances are given only when every image of both folders carries the same kind of coordinates.

A query folder inside the database folder (or the same folder for both) puts each query's own file in
the database: it finds itself at score 1 and 0 m, and the summary would read as a perfect result.
:func:`same_file_rows` finds those files (the same file on disk: same device and inode, so a symlink
or a hard link counts too; a byte-identical copy does not). ``self_matches="report"`` (default)
keeps them in the results and counts them in the summary; ``"exclude"`` searches each query without
its own file.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from aggzoo.data.folder import EARTH_RADIUS_M, lat_lon_to_ecef
from aggzoo.data.image_policy import ImagePolicy, scan_images
from aggzoo.data.layout import IMAGE_EXTENSIONS, images_under
from aggzoo.data.vg import utm_from_name
from aggzoo.errors import DatasetFormatError, DatasetLayoutError
from aggzoo.evaluation.extraction import extract_descriptors
from aggzoo.evaluation.options import EvaluationOptions
from aggzoo.evaluation.report import plot_predictions
from aggzoo.evaluation.search import search_with_scores, without_rows

__all__ = ["SELF_MATCH_CHOICES", "UNLABELLED_LAYOUT", "Predictions", "coordinates_from_names", "image_folder", "predict",
           "readable_images", "same_file_rows", "write_predictions"]

#: what to do with a query whose own file is in the database: keep and count it, or search without it
SELF_MATCH_CHOICES = ("report", "exclude")

UNLABELLED_LAYOUT = (f"database=<folder> and queries=<folder>, each holding image files ({', '.join(IMAGE_EXTENSIONS)}; "
                     "sub-folders are searched too), no ground truth needed")


def image_folder(folder: str | Path | None, role: str) -> tuple[Path, ...]:
    """The images under ``folder`` (recursive, sorted by path); a missing or empty folder raises
    :class:`DatasetLayoutError` naming the setting and the expected layout."""
    if folder is None or str(folder) == "":
        raise DatasetLayoutError(f"{role}= is not set: without ground truth eval.py needs both folders. "
                                 f"Expected {UNLABELLED_LAYOUT}")
    return images_under(folder, f"{role}={folder}", UNLABELLED_LAYOUT)


def readable_images(paths: Sequence[Path], policy: ImagePolicy, *, num_workers: int | None = None,
                    progress: bool | None = None) -> tuple[Path, ...]:
    """``paths`` without the files that cannot be decoded (each decoded once), each recorded in ``policy``
    (``bad_images=skip``: a stray ``._photo.jpg`` of macOS, a truncated download)."""
    problems = scan_images(paths, full=True, num_workers=num_workers, progress=progress)
    for index, reason in sorted(problems.items()):
        policy.record(paths[index], reason)
    return tuple(p for i, p in enumerate(paths) if i not in problems)


def _vg_utm(name: str) -> tuple[float, float] | None:
    try:
        return utm_from_name(name)  # the VG loader's own reading of the name
    except DatasetFormatError:
        return None


def _gsv_lat_lon(name: str) -> tuple[float, float] | None:
    fields = Path(name).stem.split("_")
    if len(fields) < 8:
        return None
    try:
        lat, lon = float(fields[-3]), float(fields[-2])
    except ValueError:
        return None
    return (lat, lon) if abs(lat) <= 90 and abs(lon) <= 180 else None


_READERS: dict[str, Callable[[str], tuple[float, float] | None]] = {"utm": _vg_utm, "latlon": _gsv_lat_lon}


def coordinates_from_names(paths: Sequence[Path]) -> tuple[str, np.ndarray] | None:
    """``(kind, [N, 2] coordinates)`` from the file names: ``"utm"`` (east, north in metres) or
    ``"latlon"`` (degrees); ``None`` unless every name carries the same kind."""
    for kind, reader in _READERS.items():
        values = [reader(Path(p).name) for p in paths]
        if values and all(v is not None for v in values):
            return kind, np.asarray(values, dtype=np.float64)
    return None


def _distances(kind: str, queries: np.ndarray, database: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """``[Q, k]`` metres from each query to its retrieved database images (NaN where none)."""
    valid = indices >= 0
    picked = database[np.where(valid, indices, 0)]  # [Q, k, 2]
    if kind == "utm":
        metres = np.linalg.norm(picked - queries[:, None, :], axis=-1)
    else:
        chord = np.linalg.norm(lat_lon_to_ecef(picked.reshape(-1, 2)).reshape(*picked.shape[:2], 3)
                               - lat_lon_to_ecef(queries)[:, None, :], axis=-1)
        metres = 2 * EARTH_RADIUS_M * np.arcsin(np.clip(chord / (2 * EARTH_RADIUS_M), 0.0, 1.0))  # great circle
    return np.where(valid, metres, np.nan)


def same_file_rows(query_paths: Sequence[Path], database_paths: Sequence[Path]) -> list[np.ndarray]:
    """Per query, the database rows that are the query's own file (same device and inode), ``int64 [n_q]``."""
    def identity(path: Path) -> tuple[int, int]:
        info = os.stat(path)
        return info.st_dev, info.st_ino

    rows: dict[tuple[int, int], list[int]] = {}
    for row, path in enumerate(database_paths):
        rows.setdefault(identity(path), []).append(row)
    return [np.asarray(rows.get(identity(path), ()), dtype=np.int64) for path in query_paths]


@dataclass
class Predictions:
    """Top-``k`` database images per query.

    Attributes:
        indices: ``[Q, k]`` database rows, best first (``-1``: fewer than ``k`` found).
        scores: ``[Q, k]`` inner products of the descriptors (cosine for L2-normalised ones), or with
            ``metric == "l2"`` their squared L2 distances (smallest first).
        distances_m: ``[Q, k]`` metres between query and result from the file names, or None.
        coordinates: ``"utm"`` / ``"latlon"`` (what the names carry), or None.
        own_rows: per query, the database rows that are its own file (:func:`same_file_rows`).
        self_matches: ``"report"`` (own files kept in the results) or ``"exclude"`` (searched without).
    """

    query_paths: tuple[Path, ...]
    database_paths: tuple[Path, ...]
    indices: np.ndarray
    scores: np.ndarray
    distances_m: np.ndarray | None = None
    coordinates: str | None = None
    descriptor_dim: int = 0
    metric: str = "ip"
    own_rows: Sequence[np.ndarray] = ()
    self_matches: str = "report"

    def self_match_counts(self) -> dict[str, int]:
        """How many queries are files of the database, found their own file in their top-k, and at top-1."""
        own = list(self.own_rows) or [np.empty(0, dtype=np.int64)] * len(self.query_paths)
        found = [np.isin(self.indices[q], rows) for q, rows in enumerate(own)]
        return {"queries_in_database": sum(rows.size > 0 for rows in own),
                "queries_that_found_their_own_file": sum(bool(f.any()) for f in found),
                "queries_whose_top1_is_their_own_file": sum(bool(f[:1].any()) for f in found)}

    def summary(self, radius_m: float = 25.0) -> dict[str, Any]:
        """Counts and, with coordinates, the median top-1 distance and the share of queries whose
        top-1 lies within ``radius_m`` (what Recall@1 would be with names as ground truth)."""
        out: dict[str, Any] = {"num_queries": len(self.query_paths), "num_database": len(self.database_paths),
                               "k": int(self.indices.shape[1]), "descriptor_dim": self.descriptor_dim,
                               "coordinates": self.coordinates, "metric": self.metric,
                               "self_matches": self.self_matches, **self.self_match_counts()}
        if self.distances_m is not None:
            top1 = self.distances_m[:, 0]
            out["median_top1_distance_m"] = round(float(np.nanmedian(top1)), 2)
            out[f"top1_within_{radius_m:g}m"] = round(float(np.mean(top1 <= radius_m)), 4)
        return out


def predict(
    model: nn.Module,
    database_paths: Sequence[Path],
    query_paths: Sequence[Path],
    transform: Callable[[np.ndarray], torch.Tensor],
    options: EvaluationOptions = EvaluationOptions(),
    k: int = 10,
    self_matches: str = "report",
) -> Predictions:
    """Extract both folders' descriptors and search: the top ``min(k, N_db)`` per query.

    ``options``: its ``extraction`` (batch size, workers, device, progress) and ``search`` (index, metric,
    two-stage) parts are used. ``self_matches``: ``"report"`` keeps a query's own file (one that is in the
    database too) in its results, ``"exclude"`` searches without it.
    """
    if self_matches not in SELF_MATCH_CHOICES:
        raise ValueError(f"self_matches must be one of {SELF_MATCH_CHOICES}, got {self_matches!r}")
    database_paths, query_paths = tuple(map(Path, database_paths)), tuple(map(Path, query_paths))
    own = same_file_rows(query_paths, database_paths)
    database = extract_descriptors(model, database_paths, transform, options.extraction, desc="database")
    queries = extract_descriptors(model, query_paths, transform, options.extraction, desc="queries")
    width = min(k, len(database_paths))
    metric = options.search.metric
    # Excluding: search deep enough that k results remain after each query's own rows are dropped.
    extra = max((rows.size for rows in own), default=0) if self_matches == "exclude" else 0
    scores, indices = search_with_scores(database, queries, min(width + extra, len(database_paths)), options.search)
    if self_matches == "exclude":
        scores, indices = without_rows(scores, indices, own, width, np.inf if metric == "l2" else -np.inf)
    out = Predictions(query_paths, database_paths, indices, scores, descriptor_dim=int(queries.shape[1]), metric=metric,
                      own_rows=own, self_matches=self_matches)
    db_coords, q_coords = coordinates_from_names(database_paths), coordinates_from_names(query_paths)
    if db_coords is not None and q_coords is not None and db_coords[0] == q_coords[0]:
        out.coordinates = db_coords[0]
        out.distances_m = _distances(out.coordinates, q_coords[1], db_coords[1], indices)
    return out


def _caption(score: float, distance: float | None) -> str:
    return f"{score:.3f}" + (f", {distance:.0f} m" if distance is not None and math.isfinite(distance) else "")


def write_predictions(predictions: Predictions, out_dir: str | Path, *, meta: dict[str, Any] | None = None,
                      picture: bool = True, grid_queries: int = 6, grid_k: int = 5) -> dict[str, Path]:
    """``predictions.csv`` (query, rank, database, score, distance_m), ``predictions.json`` (``meta``,
    the summary and the same rows per query) and ``predictions.png`` under ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    p = predictions
    rows: list[dict[str, Any]] = []
    per_query = []
    for q, query in enumerate(p.query_paths):
        results = []
        for rank, db in enumerate(p.indices[q], start=1):
            if db < 0:
                continue
            distance = None if p.distances_m is None else round(float(p.distances_m[q, rank - 1]), 2)
            row = {"query": str(query), "rank": rank, "database": str(p.database_paths[db]),
                   "score": round(float(p.scores[q, rank - 1]), 6), "distance_m": distance}
            rows.append(row)
            results.append({k: v for k, v in row.items() if k != "query"})
        per_query.append({"query": str(query), "results": results})
    files = {"csv": out_dir / "predictions.csv", "json": out_dir / "predictions.json"}
    with files["csv"].open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["query", "rank", "database", "score", "distance_m"])
        writer.writeheader()
        writer.writerows([{**r, "distance_m": "" if r["distance_m"] is None else r["distance_m"]} for r in rows])
    document = {"meta": dict(meta or {}), "summary": p.summary(), "predictions": per_query}
    files["json"].write_text(json.dumps(document, indent=2) + "\n")
    if picture:
        captions = [[_caption(float(p.scores[q, r]), None if p.distances_m is None else float(p.distances_m[q, r]))
                     for r in range(p.indices.shape[1])] for q in range(len(p.query_paths))]
        title = "predictions (score" + (", metres from the query by file name)" if p.coordinates else ")")
        files["picture"] = plot_predictions(p.query_paths, p.database_paths, p.indices, out_dir / "predictions.png",
                                            captions=captions, grid=(grid_queries, grid_k), title=title)
    return files
