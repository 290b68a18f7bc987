"""Small image files of uniform noise, for tests that need real files on disk (not decoded arrays)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


def write_noise_images(folder: Path, count: int, shape: tuple[int, int, int], *, seed: int,
                       high: int = 256, name: str = "{i}.png") -> list[Path]:
    """``count`` PNGs of ``uint8`` noise of ``shape`` ``(H, W, 3)`` drawn in ``[0, high)`` by one
    ``np.random.default_rng(seed)``, in order, named ``name.format(i=i)``; returns their paths."""
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(count):
        path = folder / name.format(i=i)
        Image.fromarray(rng.integers(0, high, shape, dtype=np.uint8)).save(path)
        paths.append(path)
    return paths
