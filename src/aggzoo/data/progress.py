"""Progress bars over loops on a dataset (extraction, image scans), as Lightning's trainer shows.

tqdm, written to stderr; ``enabled=None`` shows a bar only when stderr is a terminal, so logs, CI and
tests stay quiet, and ``False`` / ``True`` force it off or on (``evaluation.progress``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from tqdm import tqdm

__all__ = ["progress_bar"]

T = TypeVar("T")


@contextmanager
def progress_bar(iterable: Iterable[T] | None, enabled: bool | None = None, desc: str = "",
                 **kwargs: Any) -> Iterator[tqdm]:
    """``with progress_bar(loader, enabled, "database") as batches: for batch in batches: ...`` (or
    ``iterable=None, total=n`` and ``bar.update(k)``); the bar is closed (and erased) however the loop ends."""
    bar = tqdm(iterable, desc=desc, disable=None if enabled is None else not enabled, leave=False,
               dynamic_ncols=True, **kwargs)
    try:
        yield bar
    finally:
        bar.close()
