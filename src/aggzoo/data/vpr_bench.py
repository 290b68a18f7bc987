"""The VPR-Bench layout (Zaffar et al., IJCV 2021; MubarizZaffar/VPR-Bench, MIT)::

    <root>/query/<number>.jpg        queries, indexed in numeric order of their names
    <root>/ref/<number>.jpg          references (database), the same
    <root>/ground_truth_new.npy      object array of rows [query_index, [reference indices]]

VPR-Bench lists ``*.jpg`` in each folder and sorts by the integer file name, so index ``i`` is the
``i``-th file in that order (``10.jpg`` after ``9.jpg``). Queries missing from the ground truth have
no positive. Nordland (VPR-Bench's subset), SPEDTEST, GardensPoint, 17places, ESSEX3IN1,
CrossSeason, Corridor, Living room, Synthia and Tokyo 24/7 (VPR-Bench version) ship this way.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from aggzoo.data.layout import list_images, load_npy, positive_arrays, require_dir, require_file
from aggzoo.data.retrieval_set import RetrievalSet
from aggzoo.errors import DatasetFormatError

__all__ = ["VPR_BENCH_LAYOUT", "VPR_BENCH_SOURCE", "load_vpr_bench"]

VPR_BENCH_LAYOUT = "<root>/query/<n>.jpg, <root>/ref/<n>.jpg, <root>/ground_truth_new.npy (rows [q, [ref indices]])"
VPR_BENCH_SOURCE = (
    "https://github.com/MubarizZaffar/VPR-Bench (ground truth in datasets/<name>/; images from the link in its "
    "README, e.g. https://surfdrive.surf.nl/files/index.php/s/sbZRXzYe3l0v67W)"
)


def _sorted_images(folder: Path) -> tuple[Path, ...]:
    images = list_images(folder, recursive=False)
    stems = [p.stem for p in images]
    if all(s.isdigit() for s in stems):
        return tuple(sorted(images, key=lambda p: int(p.stem)))
    bad = next(p for p, s in zip(images, stems) if not s.isdigit())
    raise DatasetFormatError(
        f"{bad}: VPR-Bench images are named by their index (0.jpg, 1.jpg or 0000000.jpg ...), so the ground "
        "truth can refer to them; rename the files or use the folder+CSV format (aggzoo.data.folder)"
    )


def load_vpr_bench(
    root: str | Path,
    *,
    name: str | None = None,
    query_folder: str = "query",
    database_folder: str = "ref",
    ground_truth_file: str = "ground_truth_new.npy",
    source: str = VPR_BENCH_SOURCE,
) -> RetrievalSet:
    """Load a VPR-Bench dataset folder.

    Args:
        root: the dataset folder (``.../VPR-Bench/datasets/Nordland``).
        name: benchmark name in reports (default the folder name).
    """
    root = Path(root)
    layout = VPR_BENCH_LAYOUT.replace("query/", f"{query_folder}/").replace("ref/", f"{database_folder}/")
    require_dir(root, "VPR-Bench dataset folder", layout, source)
    q_dir = require_dir(root / query_folder, "query folder", layout, source)
    db_dir = require_dir(root / database_folder, "reference folder", layout, source)
    gt_path = require_file(root / ground_truth_file, "ground truth", layout, source)
    query_paths, database_paths = _sorted_images(q_dir), _sorted_images(db_dir)

    rows = load_npy(gt_path, objects=True)  # ragged rows: an object array, read without running code
    by_query: dict[int, object] = {}
    for r, row in enumerate(rows):
        try:
            q, refs = int(row[0]), row[1]
        except (TypeError, ValueError, IndexError):
            raise DatasetFormatError(f"{gt_path}: row {r} is not [query_index, [reference indices]]") from None
        if not 0 <= q < len(query_paths):
            raise DatasetFormatError(f"{gt_path}: row {r} names query {q}, but {q_dir} holds {len(query_paths)} images")
        by_query[q] = refs
    empty = np.empty(0, dtype=np.int64)
    positives = positive_arrays((by_query.get(q, empty) for q in range(len(query_paths))), len(database_paths), gt_path)
    return RetrievalSet(name=name or root.name, database_paths=database_paths, query_paths=query_paths,
                        positives=positives)
