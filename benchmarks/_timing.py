"""The timing rule the benchmark scripts share: the median wall time of repeated calls."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
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


def interleaved_seconds(fns: Mapping[Hashable, Callable[[], object]], repeats: int, *,
                        warmup: bool = True) -> dict[Hashable, list[float]]:
    """Wall seconds of ``repeats`` rounds, each calling every one of ``fns`` once in order (after one untimed
    round when ``warmup``): a shared machine that slows down or speeds up between rounds then shifts every
    entry of a round alike, so per-round ratios against a baseline entry cancel the drift that timing each
    entry's runs back to back would put into the ratio."""
    if warmup:
        for fn in fns.values():
            fn()
    times: dict[Hashable, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def round_ratios(times: Mapping[Hashable, Sequence[float]], baseline: Hashable, name: Hashable) -> list[float]:
    """``baseline``'s seconds over ``name``'s, round by round (:func:`interleaved_seconds`), sorted: the speed of
    ``name`` as a fraction of the baseline's, with the machine's drift between rounds cancelled."""
    return sorted(b / t for b, t in zip(times[baseline], times[name]))


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
