"""Helpers shared by the evaluation-format loaders: listing images, checking folders, ground truth.

Every loader fails with one message naming what it expected (the layout) and where the data is
published, so a user who points ``paths.data_root`` at the wrong place learns how to fix it.
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from scipy.spatial import cKDTree

from aggzoo.data.safe_pickle import unpickle_data
from aggzoo.errors import DatasetFormatError, DatasetLayoutError

__all__ = [
    "IMAGE_EXTENSIONS",
    "images_under",
    "list_images",
    "natural_key",
    "require_dir",
    "require_file",
    "require_images",
    "positive_arrays",
    "positives_within_radius",
]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")


def natural_key(path: Path | str) -> tuple:
    """Sort key reading digit runs as numbers: ``2.jpg`` before ``10.jpg``."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(path)))


def list_images(folder: str | Path, *, recursive: bool = True, numeric: bool = False) -> tuple[Path, ...]:
    """Image files under ``folder``, sorted by path (``numeric``: digit runs compared as numbers)."""
    folder = Path(folder)
    found = (p for p in (folder.rglob("*") if recursive else folder.iterdir())
             if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file())
    return tuple(sorted(found, key=natural_key if numeric else None))


def images_under(folder: str | Path, name: str, layout: str) -> tuple[Path, ...]:
    """The images under ``folder`` (:func:`list_images`: recursive, sorted by path); a missing folder, a file or a
    folder without images raises :class:`DatasetLayoutError` starting with ``name`` (how the user gave the folder)
    and ending with the expected ``layout``."""
    path = Path(folder).expanduser()
    if not path.is_dir():
        what = "a file, not a folder" if path.exists() else "no such folder"
        raise DatasetLayoutError(f"{name}: {what}. Expected {layout}")
    images = list_images(path)
    if not images:
        found = sorted(p.name for p in path.iterdir())[:8]
        raise DatasetLayoutError(f"{name} holds no image files (found {found or 'nothing'}). Expected {layout}")
    return images


def _layout_hint(path: Path) -> str:
    parent = path.parent
    if parent.is_dir():
        found = sorted(p.name for p in parent.iterdir())[:12]
        return f" Found in {parent}: {found}." if found else f" {parent} is empty."
    return ""


def require_dir(path: Path, what: str, layout: str, source: str) -> Path:
    """``path`` if it is a folder, else :class:`DatasetLayoutError` naming the layout and source."""
    if path.is_dir():
        return path
    raise DatasetLayoutError(
        f"{what} not found: {path}.{_layout_hint(path)} Expected layout: {layout}. Data: {source}. "
        "Point the benchmark at it (paths.data_root=/your/datasets, or benchmark.<name>.root=...)."
    )


def require_file(path: Path, what: str, layout: str, source: str) -> Path:
    """``path`` if it is a file, else :class:`DatasetLayoutError` naming the layout and source."""
    if path.is_file():
        return path
    raise DatasetLayoutError(
        f"{what} not found: {path}.{_layout_hint(path)} Expected layout: {layout}. Data: {source}."
    )


def require_images(paths: Sequence[Path], what: str, layout: str, source: str) -> None:
    """Nothing when every path is a file, else :class:`DatasetLayoutError` counting the missing ones and
    naming the first three, the layout and the source."""
    missing = [p for p in paths if not p.is_file()]
    if missing:
        shown = ", ".join(str(p) for p in missing[:3])
        raise DatasetLayoutError(
            f"{len(missing)} of {len(paths)} {what} are missing (first: {shown}). "
            f"Expected layout: {layout}. Data: {source}."
        )


def positive_arrays(
    lists: Iterable[Sequence[int] | np.ndarray | int], num_database: int, origin: str | Path
) -> tuple[np.ndarray, ...]:
    """Per-query positive lists (object-array rows, lists, scalars) as sorted unique ``int64`` arrays.

    Raises :class:`DatasetFormatError` naming ``origin`` when an index is outside ``[0, num_database)``.
    """
    out = []
    for q, row in enumerate(lists):
        try:
            arr = np.unique(np.asarray(row, dtype=np.int64).reshape(-1))
        except (TypeError, ValueError) as err:
            raise DatasetFormatError(f"{origin}: positives of query {q} are not integers ({err})") from None
        if arr.size and (arr[0] < 0 or arr[-1] >= num_database):
            raise DatasetFormatError(
                f"{origin}: query {q} lists database index {arr[0] if arr[0] < 0 else arr[-1]}, outside "
                f"[0, {num_database}) — the ground truth does not match the {num_database} database images"
            )
        out.append(arr)
    return tuple(out)


def positives_within_radius(
    database_xy: np.ndarray, queries_xy: np.ndarray, radius: float
) -> tuple[np.ndarray, ...]:
    """Per query, the sorted ``int64`` indices of database points at distance ``<= radius``.

    Args:
        database_xy: ``[N_db, d]`` metric coordinates.
        queries_xy: ``[N_q, d]`` metric coordinates.
    """
    if len(database_xy) == 0:
        return tuple(np.empty(0, dtype=np.int64) for _ in range(len(queries_xy)))
    if len(queries_xy) == 0:
        return ()
    tree = cKDTree(np.asarray(database_xy, dtype=np.float64))
    neighbours = tree.query_ball_point(np.asarray(queries_xy, dtype=np.float64), r=float(radius))
    return tuple(np.sort(np.asarray(n, dtype=np.int64)) for n in neighbours)


def load_npy(path: Path, *, objects: bool = False) -> np.ndarray:
    """A ``.npy`` file as an array. ``objects=True`` also reads object arrays (ragged ground-truth
    lists), through an unpickler that knows only numpy's array types: no code in the file runs.

    Raises:
        DatasetFormatError: not a ``.npy`` file, or (objects) a pickle naming anything but numpy types.
    """
    try:
        with Path(path).open("rb") as file:
            version = np.lib.format.read_magic(file)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            _, _, dtype = read_header(file)
            if not dtype.hasobject:
                file.seek(0)
                return np.load(file, allow_pickle=False)
            if not objects:
                raise DatasetFormatError(f"{path}: holds Python objects where an array of numbers or strings is expected")
            array = unpickle_data(file, path, what="ground-truth .npy",
                                  fix="re-download it from the dataset's source")
    except DatasetFormatError:
        raise
    except (pickle.UnpicklingError, ValueError, OSError, EOFError, TypeError, KeyError, IndexError,
            AttributeError) as err:
        raise DatasetFormatError(f"{path}: cannot read as .npy ({err})") from None
    if not isinstance(array, np.ndarray):
        raise DatasetFormatError(f"{path}: cannot read as .npy (it pickles a {type(array).__name__}, not an array)")
    return array
