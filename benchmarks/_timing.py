"""The timing rule the benchmark scripts share: the median wall time of repeated calls."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_seconds(fn: Callable[[], object], repeats: int, *, warmup: bool = True) -> float:
    """Median seconds of ``repeats`` calls of ``fn``, after one untimed call when ``warmup`` (allocator,
    oneDNN primitive and file caches)."""
    if warmup:
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
