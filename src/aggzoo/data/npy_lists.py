"""The npy-list layout of gsv-cities, SALAD and BoQ: image lists and ground truth as ``.npy`` files.

gsv-cities (amaralibey/gsv-cities, ``datasets/<Dataset>/``) ships, per benchmark ``<prefix>``::

    <lists_dir>/<prefix>_dbImages.npy   [N_db] str   database image paths relative to the image root
    <lists_dir>/<prefix>_qImages.npy    [N_q]  str   query image paths relative to the image root
    <lists_dir>/<prefix>_gt.npy         [N_q]  object, row q = int array of positive database indices

and for MSLS-val, where only queries with a positive are evaluated (740 of the 747 im2im queries)::

    <lists_dir>/msls_val_qIdx.npy       [740]  int, the kept rows of msls_val_qImages.npy
    <lists_dir>/msls_val_pIdx.npy       [740]  object, positives of each kept query

Image paths are joined to ``root`` (the folder the dataset was unpacked to). The same loader reads
Pitts30k/250k (``pitts30k_test``...), Nordland* (the VPR-Bench Nordland subset, 2760 queries, 27592
references, positives +-1 frame), SPED, and a user's own lists written the same way.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from aggzoo.data.layout import load_npy, positive_arrays, require_dir, require_file
from aggzoo.data.retrieval_set import RetrievalSet
from aggzoo.errors import DatasetFormatError

__all__ = ["NPY_LISTS_SOURCE", "load_npy_lists"]

NPY_LISTS_SOURCE = (
    "lists: https://github.com/amaralibey/gsv-cities (folder datasets/), images: the dataset's own download "
    "(MSLS: https://www.mapillary.com/dataset/places; Nordland/SPED: VPR-Bench, "
    "https://github.com/MubarizZaffar/VPR-Bench; Pittsburgh: https://data.ciirc.cvut.cz/public/projects/"
    "2015netVLAD/Pittsburgh250k/)"
)


def _load(path: Path, what: str, layout: str, source: str, *, pickle: bool = False) -> np.ndarray:
    require_file(path, what, layout, source)
    return load_npy(path, objects=pickle)  # object arrays without running code from the file


def _paths(root: Path, array: np.ndarray, origin: Path) -> tuple[Path, ...]:
    if array.ndim != 1:
        raise DatasetFormatError(f"{origin}: expected a 1-D array of image paths, got shape {array.shape}")
    return tuple(root / str(p) for p in array.tolist())


def load_npy_lists(
    root: str | Path,
    *,
    prefix: str,
    lists_dir: str | Path | None = None,
    name: str | None = None,
    query_index_file: str | None = None,
    positives_file: str | None = None,
    check_images: bool = True,
    source: str = NPY_LISTS_SOURCE,
) -> RetrievalSet:
    """Load a benchmark stored as gsv-cities-style npy lists.

    Args:
        root: image root; the listed relative paths are joined to it.
        prefix: file-name prefix (``pitts30k_test``, ``msls_val``, ``Nordland``, ``SPED``).
        lists_dir: folder of the ``.npy`` files (default ``root``).
        name: benchmark name in reports (default ``prefix``).
        query_index_file: ``.npy`` of kept query rows (MSLS-val: ``msls_val_qIdx.npy``).
        positives_file: ground-truth file name, default ``<prefix>_gt.npy`` (MSLS-val: ``msls_val_pIdx.npy``).
            It holds one row per query, or per kept query when ``query_index_file`` is given.
        check_images: check that the first database and query images exist, so a wrong ``root`` fails
            here rather than minutes into extraction.
    """
    root = Path(root)
    lists = Path(lists_dir) if lists_dir is not None else root
    gt_name = positives_file or f"{prefix}_gt.npy"
    layout = (f"{lists}/{prefix}_dbImages.npy, {prefix}_qImages.npy, {gt_name}"
              + (f", {query_index_file}" if query_index_file else "")
              + f" (gsv-cities lists) with image paths relative to {root}/")
    require_dir(lists, "npy-list folder", layout, source)
    db_file, q_file, gt_file = (lists / f"{prefix}_dbImages.npy", lists / f"{prefix}_qImages.npy", lists / gt_name)
    database_paths = _paths(root, _load(db_file, "database list", layout, source), db_file)
    query_paths = _paths(root, _load(q_file, "query list", layout, source), q_file)
    ground_truth = _load(gt_file, "ground truth", layout, source, pickle=True)

    if query_index_file:
        index_file = lists / query_index_file
        kept = _load(index_file, "kept-query index", layout, source).astype(np.int64).reshape(-1)
        if kept.size and (kept.min() < 0 or kept.max() >= len(query_paths)):
            raise DatasetFormatError(f"{index_file}: query index outside [0, {len(query_paths)})")
        if len(ground_truth) == len(query_paths) != len(kept):
            ground_truth = ground_truth[kept]  # ground truth given for every query: keep the same rows
        query_paths = tuple(query_paths[i] for i in kept)
    if len(ground_truth) != len(query_paths):
        raise DatasetFormatError(
            f"{gt_file}: {len(ground_truth)} ground-truth rows for {len(query_paths)} queries"
            + (" (after keeping the rows of the query index)" if query_index_file else "")
        )
    positives = positive_arrays(ground_truth, len(database_paths), gt_file)
    if check_images:
        for what, paths in (("database", database_paths), ("query", query_paths)):
            if paths:
                require_file(paths[0], f"first {what} image", layout, source)
    return RetrievalSet(name=name or prefix, database_paths=database_paths, query_paths=query_paths,
                        positives=positives)
