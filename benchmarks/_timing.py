"""The timing rule the benchmark scripts share: the median wall time of repeated calls."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path


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


def write_random_jpegs(folder: str | Path, count: int, *, seed: int = 0, size: tuple[int, int] = (480, 640)) -> list[Path]:
    """``count`` random-noise JPEGs ``folder/00000.jpg, ...`` of ``size`` (H, W): a decode-and-resize
    workload for extraction benchmarks that downloads nothing."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    paths = []
    for i in range(count):
        path = Path(folder) / f"{i:05d}.jpg"
        Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(path)
        paths.append(path)
    return paths
