"""What happens to an image that cannot be read: fail at once, or skip it and list it.

``fail`` (the evaluation default: a benchmark with a missing image is not that benchmark) raises
:class:`~aggzoo.data.images.ImageReadError` naming the file. ``skip`` (the training default) records
the file and its reason and lets the caller carry on without it: a training place draws another of
its images (see :class:`aggzoo.data.gsv_cities.GSVCitiesDataset`), an evaluation set drops the image
before extraction (:func:`drop_unreadable`).

Skipped files are appended to a tab-separated list (``<path>\\t<reason>``, one line per event) that
every DataLoader worker process can append to; :meth:`ImagePolicy.skipped` reads it back
de-duplicated and :meth:`ImagePolicy.finalize` rewrites it sorted, one line per file, next to the
results.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError
from torch.utils.data import DataLoader, Dataset

from aggzoo.data.images import ImageReadError, read_rgb
from aggzoo.data.progress import progress_bar
from aggzoo.data.retrieval_set import GroundTruth, RetrievalSet
from aggzoo.data.workers import loader_workers

__all__ = ["BAD_IMAGE_CHOICES", "ImagePolicy", "scan_images", "drop_unreadable", "check_readable"]

log = logging.getLogger(__name__)

BAD_IMAGE_CHOICES = ("fail", "skip")
SKIPPED_LIST_NAME = "bad_images.tsv"


@dataclass
class ImagePolicy:
    """How unreadable images are handled (picklable: it travels to DataLoader workers).

    Args:
        on_error: ``"fail"`` raises on the first unreadable file; ``"skip"`` records it and returns
            ``None`` from :meth:`read`.
        log_path: file the skipped images are appended to (created on first use); ``None`` keeps
            them in this process only (enough without loader workers).
        hint: appended to the error message under ``fail`` (how to switch policy from the CLI).
    """

    on_error: str = "fail"
    log_path: Path | None = None
    hint: str = ""
    _skipped: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.on_error not in BAD_IMAGE_CHOICES:
            raise ValueError(f"bad_images must be one of {BAD_IMAGE_CHOICES}, got {self.on_error!r}")
        if self.log_path is not None:
            self.log_path = Path(self.log_path)

    @classmethod
    def coerce(cls, value: ImagePolicy | str) -> ImagePolicy:
        """An :class:`ImagePolicy` from itself or from ``"fail"`` / ``"skip"``."""
        return value if isinstance(value, ImagePolicy) else cls(on_error=str(value))

    @property
    def skips(self) -> bool:
        return self.on_error == "skip"

    def read(self, path: str | Path) -> np.ndarray | None:
        """``uint8 [H, W, 3]`` RGB, or ``None`` for an unreadable file under ``skip``."""
        try:
            return read_rgb(path)
        except ImageReadError as err:
            if not self.skips:
                if self.hint:
                    raise ImageReadError(f"{err}. {self.hint}") from err
                raise
            self.record(path, err.reason)
            return None

    def record(self, path: str | Path, reason: str) -> None:
        """Remember a skipped file (appended to :attr:`log_path` when set)."""
        key = str(path)
        first_time = key not in self._skipped
        self._skipped.setdefault(key, reason)
        if first_time:
            log.warning("skipping unreadable image: %s", reason)
        if self.log_path is not None:
            line = f"{key}\t{' '.join(reason.split())}\n"
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            # One write() per line on an O_APPEND file: lines from several workers do not interleave.
            fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)

    def skipped(self) -> dict[str, str]:
        """``{path: reason}`` of every file skipped so far (by any process writing to :attr:`log_path`)."""
        out = dict(self._skipped)
        if self.log_path is not None and self.log_path.is_file():
            for line in self.log_path.read_text().splitlines():
                path, _, reason = line.partition("\t")
                if path:
                    out.setdefault(path, reason)
        return out

    def finalize(self) -> dict[str, str]:
        """Rewrite :attr:`log_path` as one sorted line per skipped file; returns the files."""
        skipped = self.skipped()
        if self.log_path is not None and skipped:
            tmp = self.log_path.with_name(f".{self.log_path.name}.tmp-{os.getpid()}")
            tmp.write_text("".join(f"{p}\t{r}\n" for p, r in sorted(skipped.items())))
            os.replace(tmp, self.log_path)
        return skipped


# -- scanning --------------------------------------------------------------------------------------


def _header_problem(path: Path) -> str | None:
    """Cheap check (no pixel decoding): exists, non-empty, identifiable. Returns the reason."""
    try:
        if path.stat().st_size == 0:
            return "empty file (0 bytes)"
        with Image.open(path) as image:
            width, height = image.size
        if width < 1 or height < 1:
            return f"zero-sized image ({width}x{height})"
    except FileNotFoundError:
        return "file not found"
    except UnidentifiedImageError:
        return "not an image Pillow can identify (corrupt, or not an image despite its extension)"
    except Image.DecompressionBombError as err:
        return str(err)
    except OSError as err:
        return f"{type(err).__name__}: {err}"
    return None


def _full_problem(path: Path) -> str | None:
    try:
        read_rgb(path)
    except ImageReadError as err:
        return err.reason
    return None


class _ScanDataset(Dataset):
    def __init__(self, paths: Sequence[Path], full: bool) -> None:
        self.paths, self.full = list(paths), full

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[int, str]:
        path = Path(self.paths[index])
        problem = _full_problem(path) if self.full else _header_problem(path)
        return index, problem or ""


def scan_images(paths: Sequence[str | Path], *, full: bool = True, num_workers: int | None = None,
                batch_size: int = 64, progress: bool | None = None) -> dict[int, str]:
    """``{index: reason}`` of the unreadable files among ``paths``.

    ``full`` decodes every image (finds truncated files too); otherwise only headers are read
    (missing, empty and non-image files, at a fraction of the cost). ``progress``: a tqdm bar over
    the files (``None``: only when stderr is a terminal).
    """
    loader = DataLoader(_ScanDataset([Path(p) for p in paths], full), batch_size=batch_size,
                        num_workers=loader_workers(num_workers, len(paths)), collate_fn=list)
    problems: dict[int, str] = {}
    label = "decoding images" if full else "reading image headers"
    with progress_bar(None, progress, label, total=len(paths), unit="img") as bar:
        for batch in loader:
            problems.update((i, msg) for i, msg in batch if msg)
            bar.update(len(batch))
    return problems


def check_readable(retrieval_set: RetrievalSet, *, full: bool = False, num_workers: int | None = None) -> None:
    """Raise one :class:`ImageReadError` listing every unreadable image of ``retrieval_set``.

    Run before a long extraction so a bad file stops the job in seconds, not after an hour.
    """
    start = time.perf_counter()
    paths = retrieval_set.image_paths
    problems = scan_images(paths, full=full, num_workers=num_workers)
    if problems:
        shown = "\n  ".join(f"{paths[i]}: {problems[i]}" for i in sorted(problems)[:10])
        more = f"\n  ... and {len(problems) - 10} more" if len(problems) > 10 else ""
        raise ImageReadError(
            f"{len(problems)} of {len(paths)} images of benchmark {retrieval_set.name!r} cannot be read "
            f"(checked in {time.perf_counter() - start:.1f} s):\n  {shown}{more}\n"
            "Fix or remove these files (re-download the dataset), or evaluate without them with "
            "bad_images=skip (results are then not comparable to published numbers)."
        )


def drop_unreadable(retrieval_set: RetrievalSet, policy: ImagePolicy, *,
                    num_workers: int | None = None) -> tuple[RetrievalSet, dict[str, int]]:
    """``retrieval_set`` without its unreadable images (every image decoded once to find them).

    Unreadable database images leave the database (positives, junk and every ground-truth setup are
    re-indexed); unreadable queries leave the query list (with their boxes and ground truth). Each file is
    recorded in ``policy``. Returns the new set and
    ``{"skipped_database_images": n, "skipped_queries": m}``.
    """
    n_db = retrieval_set.num_database
    problems = scan_images((*retrieval_set.database_paths, *retrieval_set.query_paths), full=True,
                           num_workers=num_workers)
    all_paths = (*retrieval_set.database_paths, *retrieval_set.query_paths)
    for index, reason in sorted(problems.items()):
        policy.record(all_paths[index], reason)
    bad_db = np.array(sorted(i for i in problems if i < n_db), dtype=np.int64)
    bad_q = {i - n_db for i in problems if i >= n_db}
    counts = {"skipped_database_images": int(bad_db.size), "skipped_queries": len(bad_q)}
    if not problems:
        return retrieval_set, counts
    keep_db = np.ones(n_db, dtype=bool)
    keep_db[bad_db] = False
    new_index = np.cumsum(keep_db) - 1  # old database index -> new one (valid where kept)

    def kept(lists: tuple[np.ndarray, ...] | None) -> tuple[np.ndarray, ...] | None:
        """Per kept query, its database indices that are kept, re-indexed."""
        if lists is None:
            return None
        return tuple(new_index[p[keep_db[p]]].astype(np.int64) for q, p in enumerate(lists) if q not in bad_q)

    setups = retrieval_set.setups
    if setups is not None:
        setups = {name: GroundTruth(kept(truth.positives), kept(truth.junk)) for name, truth in setups.items()}
    boxes = retrieval_set.query_boxes
    reduced = dataclasses.replace(
        retrieval_set,
        database_paths=tuple(p for i, p in enumerate(retrieval_set.database_paths) if keep_db[i]),
        query_paths=tuple(p for q, p in enumerate(retrieval_set.query_paths) if q not in bad_q),
        positives=kept(retrieval_set.positives), junk=kept(retrieval_set.junk), setups=setups,
        query_boxes=None if boxes is None else tuple(b for q, b in enumerate(boxes) if q not in bad_q),
        distractors=int(keep_db[n_db - retrieval_set.distractors:].sum()) if retrieval_set.distractors else 0,
    )
    if reduced.num_database == 0 or reduced.num_queries == 0:
        raise ImageReadError(f"benchmark {retrieval_set.name!r}: no readable "
                             f"{'database images' if reduced.num_database == 0 else 'queries'} left")
    log.warning("%s: skipped %d of %d database images and %d of %d queries (unreadable); results are not "
                "comparable to published numbers", retrieval_set.name, counts["skipped_database_images"], n_db,
                counts["skipped_queries"], retrieval_set.num_queries)
    return reduced, counts
