"""Revisited Oxford 5k and Paris 6k (Radenović et al., "Revisiting Oxford and Paris: Large-Scale Image
Retrieval Benchmarking", CVPR 2018), in the layout filipradenovic/revisitop publishes::

    <root>/jpg/<name>.jpg            database and query images (the archives' files, no sub-folders)
    <root>/gnd_<dataset>.pkl         {"imlist": [db names], "qimlist": [query names],
                                      "gnd": [{"bbx": [x1, y1, x2, y2], "easy": [...], "hard": [...],
                                               "junk": [...]} per query]}   (zero-based indices into imlist)

and, for the +1M distractors (R1M), a folder ``<distractors>/revisitop1m.txt`` (one image path per line,
relative to ``<distractors>/jpg/``, with its extension) and ``<distractors>/jpg/`` (the 100 archives
extracted). Distractors are appended to the database after the 5k / 6k images; the ground truth is
unchanged (no distractor is positive or junk).

Ground truth, as revisitop's ``example_evaluate.py`` builds it per setup:

- Easy: positives ``easy``; junk ``junk + hard``;
- Medium: positives ``easy + hard``; junk ``junk`` (the set's default ``positives`` / ``junk``);
- Hard: positives ``hard``; junk ``junk + easy``.

Queries are the ``bbx`` crops of their images (``query_boxes``). The ``.pkl`` is read with
:func:`aggzoo.data.safe_pickle.load_data_pickle`: nothing in the file chooses code to run.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from aggzoo.data.layout import positive_arrays, require_dir, require_file, require_images
from aggzoo.data.retrieval_set import Box, GroundTruth, RetrievalSet
from aggzoo.data.safe_pickle import load_data_pickle
from aggzoo.errors import DatasetFormatError

__all__ = ["DATASETS", "R1M_SOURCE", "REVISITOP_LAYOUT", "R1M_LAYOUT", "SETUPS", "load_revisitop", "read_r1m_list"]

#: The datasets and where their images and ground truth are published.
DATASETS = {
    "roxford5k": "images: https://www.robots.ox.ac.uk/~vgg/data/oxbuildings/ (oxbuild_images.tgz, files extracted "
                 "into jpg/); ground truth: http://cmp.felk.cvut.cz/revisitop/data/datasets/roxford5k/gnd_roxford5k.pkl "
                 "(filipradenovic/revisitop, python/download.py)",
    "rparis6k": "images: https://www.robots.ox.ac.uk/~vgg/data/parisbuildings/ (paris_1.tgz and paris_2.tgz, files "
                "extracted into jpg/ without their sub-folders); ground truth: "
                "http://cmp.felk.cvut.cz/revisitop/data/datasets/rparis6k/gnd_rparis6k.pkl "
                "(filipradenovic/revisitop, python/download.py)",
}
R1M_SOURCE = ("http://ptak.felk.cvut.cz/revisitop/revisitop1m/ (revisitop1m.txt, and jpg/revisitop1m.{1..100}.tar.gz "
              "extracted into jpg/; filipradenovic/revisitop, python/download.py download_distractors)")
REVISITOP_LAYOUT = "<root>/jpg/<name>.jpg and <root>/gnd_{dataset}.pkl (a dict of imlist, qimlist and gnd)"
R1M_LAYOUT = "<distractors>/revisitop1m.txt (one path per line, relative to jpg/) and <distractors>/jpg/<path>"

#: Setup name -> (which lists are positives, which lists are added to junk).
SETUPS: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "easy": (("easy",), ("junk", "hard")),
    "medium": (("easy", "hard"), ("junk",)),
    "hard": (("hard",), ("junk", "easy")),
}
_DEFAULT_SETUP = "medium"
_METRICS = ("map", "mp")


def _names(gnd: dict, key: str, origin: Path) -> tuple[str, ...]:
    names = gnd.get(key)
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) and n for n in names):
        raise DatasetFormatError(f"{origin}: {key!r} must be a list of image names (without .jpg)")
    return tuple(names)


def _box(entry: Mapping[str, Any], q: int, origin: Path) -> Box:
    try:
        values = np.asarray(entry["bbx"], dtype=np.float64).reshape(-1)
        if values.shape != (4,):
            raise ValueError(f"{values.size} values")
    except (KeyError, TypeError, ValueError) as err:
        raise DatasetFormatError(f"{origin}: gnd[{q}]['bbx'] must be [x1, y1, x2, y2] ({type(err).__name__}: {err})") from None
    return tuple(float(v) for v in values)  # type: ignore[return-value]


def _lists(gnd_entries: Sequence[Any], num_database: int, origin: Path) -> dict[str, tuple[np.ndarray, ...]]:
    """Per list name (easy, hard, junk), per query, sorted unique database indices."""
    out = {}
    for key in ("easy", "hard", "junk"):
        rows = []
        for q, entry in enumerate(gnd_entries):
            if key not in entry:
                raise DatasetFormatError(f"{origin}: gnd[{q}] has no {key!r} list (keys: {sorted(entry)})")
            rows.append(entry[key])
        out[key] = positive_arrays(rows, num_database, f"{origin} ({key!r})")
    return out


def _read_gnd(path: Path) -> tuple[tuple[str, ...], tuple[str, ...], list[Mapping[str, Any]]]:
    gnd = load_data_pickle(path, what="revisitop ground truth", fix="re-download it from revisitop's site")
    if not isinstance(gnd, dict) or not {"imlist", "qimlist", "gnd"} <= set(gnd):
        found = sorted(gnd) if isinstance(gnd, dict) else type(gnd).__name__
        raise DatasetFormatError(f"{path}: expected a dict with 'imlist', 'qimlist' and 'gnd', found {found}")
    database, queries, entries = _names(gnd, "imlist", path), _names(gnd, "qimlist", path), gnd["gnd"]
    if not isinstance(entries, (list, tuple)) or not all(isinstance(e, dict) for e in entries):
        raise DatasetFormatError(f"{path}: 'gnd' must be a list of one dict per query")
    if len(entries) != len(queries):
        raise DatasetFormatError(f"{path}: {len(queries)} query names but {len(entries)} 'gnd' entries")
    return database, queries, entries


def read_r1m_list(distractors: str | Path) -> tuple[Path, ...]:
    """The R1M distractor image paths listed in ``<distractors>/revisitop1m.txt``, in its order.

    A line is a path relative to ``<distractors>/jpg/``; a line without an extension gets ``.jpg`` (as
    revisitop's MATLAB ``configdataset.m`` does; the Python code uses the line as it is). Only the
    first and the last image are checked here (a million ``stat`` calls are slow on network disks);
    any other missing image fails when it is read, naming the file.
    """
    folder = Path(distractors)
    require_dir(folder, "R1M distractor folder", R1M_LAYOUT, R1M_SOURCE)
    list_file = require_file(folder / "revisitop1m.txt", "R1M image list", R1M_LAYOUT, R1M_SOURCE)
    image_dir = require_dir(folder / "jpg", "R1M image folder", R1M_LAYOUT, R1M_SOURCE)
    paths = []
    # String checks, not PurePosixPath: a million lines are parsed once, by Path() below.
    for number, line in enumerate(list_file.read_text(encoding="utf-8").splitlines(), start=1):
        name = line.strip()
        if not name:
            continue
        if name.startswith(("/", "\\")) or ".." in name.replace("\\", "/").split("/"):
            raise DatasetFormatError(f"{list_file}, line {number}: {name!r} is not a path inside jpg/")
        has_extension = "." in name.rpartition("/")[2].lstrip(".")
        paths.append(image_dir / (name if has_extension else f"{name}.jpg"))
    if not paths:
        raise DatasetFormatError(f"{list_file}: lists no image. Expected layout: {R1M_LAYOUT}.")
    require_images([paths[0], paths[-1]], "images checked (the first and the last of revisitop1m.txt)",
                    R1M_LAYOUT, R1M_SOURCE)
    return tuple(paths)


def load_revisitop(
    root: str | Path,
    *,
    dataset: str = "roxford5k",
    distractors: str | Path | None = None,
    name: str | None = None,
) -> RetrievalSet:
    """Load ROxford5k or RParis6k (optionally +R1M) with its three setups, query boxes and metrics.

    Args:
        root: the dataset folder holding ``jpg/`` and ``gnd_<dataset>.pkl``.
        dataset: ``"roxford5k"`` or ``"rparis6k"`` (names the ``.pkl``).
        distractors: the R1M folder holding ``revisitop1m.txt`` and ``jpg/``; its images follow the
            5k / 6k database images.
        name: benchmark name in reports; default ``dataset``, with ``_r1m`` when distractors are added.

    Returns:
        A :class:`RetrievalSet` whose ``positives`` / ``junk`` are the Medium setup, ``setups`` holds
        ``easy``, ``medium`` and ``hard``, ``query_boxes`` the ``bbx`` of each query and ``metrics``
        ``("map", "mp")``.

    Raises:
        DatasetLayoutError: a folder, the ``.pkl``, the list or an image is missing.
        DatasetFormatError: the ``.pkl`` or the list is malformed (the message names the file).
        UnsafeDataFileError: the ``.pkl`` would run code to load; nothing was run.
    """
    if not re.fullmatch(r"[A-Za-z0-9_]+", dataset):  # it names the gnd_<dataset>.pkl file: no path in it
        raise DatasetFormatError(f"revisitop dataset name {dataset!r}: letters, digits and _ only (roxford5k, rparis6k, "
                                 "or the name of your own set's gnd_<name>.pkl)")
    # the published sets say where they are published; another set in the layout (the embedded synthetic
    # landmarks, a user's own) is read the same way
    root, source = Path(root), DATASETS.get(dataset, "a folder in the revisitop layout (e.g. aggzoo.data.synthetic_landmarks)")
    layout = REVISITOP_LAYOUT.format(dataset=dataset)
    require_dir(root, f"{dataset} folder", layout, source)
    gnd_path = require_file(root / f"gnd_{dataset}.pkl", f"{dataset} ground truth", layout, source)
    image_dir = require_dir(root / "jpg", f"{dataset} image folder", layout, source)

    database_names, query_names, entries = _read_gnd(gnd_path)
    database_paths = tuple(image_dir / f"{n}.jpg" for n in database_names)
    query_paths = tuple(image_dir / f"{n}.jpg" for n in query_names)
    require_images(database_paths + query_paths, f"images listed in {gnd_path.name}", layout, source)
    lists = _lists(entries, len(database_paths), gnd_path)
    boxes = tuple(_box(entry, q, gnd_path) for q, entry in enumerate(entries))

    setups = {}
    for setup, (positive_keys, junk_keys) in SETUPS.items():
        positives = tuple(np.unique(np.concatenate(rows)) for rows in zip(*(lists[k] for k in positive_keys)))
        junk = tuple(np.unique(np.concatenate(rows)) for rows in zip(*(lists[k] for k in junk_keys)))
        setups[setup] = GroundTruth(positives, junk)
    distractor_paths = read_r1m_list(distractors) if distractors is not None else ()
    database_paths += distractor_paths
    default = setups[_DEFAULT_SETUP]
    return RetrievalSet(
        name=name or (f"{dataset}_r1m" if distractors is not None else dataset),
        database_paths=database_paths,
        query_paths=query_paths,
        positives=default.positives,
        junk=default.junk,
        query_boxes=boxes,
        setups=setups,
        metrics=_METRICS,
        distractors=len(distractor_paths),
    )
