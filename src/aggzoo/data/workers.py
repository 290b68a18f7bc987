"""How many DataLoader worker processes read images when the caller does not say (``num_workers=None``).

Decoding and resizing a 480x640 JPEG costs ~5-10 ms of one core; a small CNN's forward pass on a CPU
costs ~100 ms per image across all cores, a GPU's far less. In worker processes the decoding overlaps
the forward pass instead of adding to it, so by default every core but one (kept for the main process,
which runs the model) decodes, up to :data:`MAX_AUTO_WORKERS`. Below :data:`AUTO_MIN_IMAGES` images
the workers' start-up (a fork and a first batch each) costs more than it saves, so small sets are read
in the main process. An explicit integer is always used as given.
"""

from __future__ import annotations

import os

__all__ = ["AUTO_MIN_IMAGES", "MAX_AUTO_WORKERS", "loader_workers", "usable_cores"]

#: fewer images than this are read in the main process by default
AUTO_MIN_IMAGES = 256
#: the default never starts more workers than this (more rarely helps and each holds a copy of the loader)
MAX_AUTO_WORKERS = 8


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity: a SLURM or container limit, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def loader_workers(num_workers: int | None, num_images: int, processes: int = 1) -> int:
    """``num_workers`` if given, else ``cores - 1`` (at most :data:`MAX_AUTO_WORKERS`) for sets of
    :data:`AUTO_MIN_IMAGES` images or more, and 0 (the main process) for smaller ones or a single core.
    ``processes``: model processes sharing this machine's cores (DDP ranks per node), each getting its share."""
    if num_workers is not None:
        return int(num_workers)
    if num_images < AUTO_MIN_IMAGES:
        return 0
    return max(0, min(MAX_AUTO_WORKERS, usable_cores() // max(1, processes) - 1))
