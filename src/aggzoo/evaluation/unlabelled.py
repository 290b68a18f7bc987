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
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from aggzoo.data.folder import EARTH_RADIUS_M, lat_lon_to_ecef
from aggzoo.data.layout import IMAGE_EXTENSIONS, list_images
from aggzoo.data.vg import utm_from_name
from aggzoo.errors import DatasetFormatError, DatasetLayoutError
from aggzoo.evaluation.extraction import extract_descriptors
from aggzoo.evaluation.options import EvaluationOptions
from aggzoo.evaluation.report import plot_predictions
from aggzoo.evaluation.search import search_with_scores

__all__ = ["UNLABELLED_LAYOUT", "Predictions", "coordinates_from_names", "image_folder", "predict", "write_predictions"]

UNLABELLED_LAYOUT = (f"database=<folder> and queries=<folder>, each holding image files ({', '.join(IMAGE_EXTENSIONS)}; "
                     "sub-folders are searched too), no ground truth needed")


def image_folder(folder: str | Path | None, role: str) -> tuple[Path, ...]:
    """The images under ``folder`` (recursive, sorted by path); a missing or empty folder raises
    :class:`DatasetLayoutError` naming the setting and the expected layout."""
    if folder is None or str(folder) == "":
        raise DatasetLayoutError(f"{role}= is not set: without ground truth eval.py needs both folders. "
                                 f"Expected {UNLABELLED_LAYOUT}")
    path = Path(folder).expanduser()
    if not path.is_dir():
        what = "a file, not a folder" if path.exists() else "no such folder"
        raise DatasetLayoutError(f"{role}={folder}: {what}. Expected {UNLABELLED_LAYOUT}")
    images = list_images(path)
    if not images:
        found = sorted(p.name for p in path.iterdir())[:8]
        raise DatasetLayoutError(f"{role}={folder} holds no image files (found {found or 'nothing'}). "
                                 f"Expected {UNLABELLED_LAYOUT}")
    return images


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


@dataclass
class Predictions:
    """Top-``k`` database images per query.

    Attributes:
        indices: ``[Q, k]`` database rows, best first (``-1``: fewer than ``k`` found).
        scores: ``[Q, k]`` inner products of the descriptors (cosine for L2-normalised ones), or with
            ``metric == "l2"`` their squared L2 distances (smallest first).
        distances_m: ``[Q, k]`` metres between query and result from the file names, or None.
        coordinates: ``"utm"`` / ``"latlon"`` (what the names carry), or None.
    """

    query_paths: tuple[Path, ...]
    database_paths: tuple[Path, ...]
    indices: np.ndarray
    scores: np.ndarray
    distances_m: np.ndarray | None = None
    coordinates: str | None = None
    descriptor_dim: int = 0
    metric: str = "ip"

    def summary(self, radius_m: float = 25.0) -> dict[str, Any]:
        """Counts and, with coordinates, the median top-1 distance and the share of queries whose
        top-1 lies within ``radius_m`` (what Recall@1 would be with names as ground truth)."""
        out: dict[str, Any] = {"num_queries": len(self.query_paths), "num_database": len(self.database_paths),
                               "k": int(self.indices.shape[1]), "descriptor_dim": self.descriptor_dim,
                               "coordinates": self.coordinates, "metric": self.metric}
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
) -> Predictions:
    """Extract both folders' descriptors and search: the top ``min(k, N_db)`` per query.

    ``options``: its ``extraction`` (batch size, workers, device, progress) and ``search`` (index, metric,
    two-stage) parts are used.
    """
    database_paths, query_paths = tuple(map(Path, database_paths)), tuple(map(Path, query_paths))
    database = extract_descriptors(model, database_paths, transform, options.extraction, desc="database")
    queries = extract_descriptors(model, query_paths, transform, options.extraction, desc="queries")
    scores, indices = search_with_scores(database, queries, min(k, len(database_paths)), options.search)
    out = Predictions(query_paths, database_paths, indices, scores, descriptor_dim=int(queries.shape[1]),
                      metric=options.search.metric)
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
