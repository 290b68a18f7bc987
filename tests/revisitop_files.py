"""A small revisited Oxford / Paris folder in the published layout (real JPEGs, a real pickled
``gnd_<dataset>.pkl``) and an R1M distractor folder, for tests of the reader and of evaluation."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
from PIL import Image

__all__ = ["DATABASE", "GND", "QUERIES", "jpeg_of_noise", "write_r1m", "write_revisitop"]

DATABASE = [f"all_souls_{i:06d}" for i in range(8)]
QUERIES = ["all_souls_000013", "ashmolean_000000", "balliol_000051"]
# Per query: easy, hard, junk (zero-based database indices) and the box, as revisitop's gnd holds them.
GND = [
    {"bbx": [136.5, 34.25, 180.5, 100.75], "easy": [0, 3], "hard": [5], "junk": [1, 7]},
    {"bbx": [2.0, 3.0, 30.0, 41.0], "easy": [], "hard": [2, 6], "junk": []},
    {"bbx": [0.4, 0.6, 63.5, 47.5], "easy": [4], "hard": [], "junk": [0]},
]


def jpeg_of_noise(path: Path, seed: int, size: tuple[int, int] = (64, 48)) -> None:
    """A JPEG of ``uint8`` noise, ``size`` = (width, height), drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(path, quality=95)


def write_revisitop(root: Path, dataset: str = "roxford5k", scale: int = 1) -> Path:
    """A revisitop-layout folder: ``jpg/`` (the 8 :data:`DATABASE` and 3 :data:`QUERIES` images, query 0
    200x120, the others 64x48, every side times ``scale``) and ``gnd_<dataset>.pkl`` holding :data:`GND` with numpy
    index arrays (the boxes times ``scale``)."""
    (root / "jpg").mkdir(parents=True)
    for i, name in enumerate(DATABASE + QUERIES):
        width, height = (200, 120) if name == QUERIES[0] else (64, 48)
        jpeg_of_noise(root / "jpg" / f"{name}.jpg", seed=i, size=(width * scale, height * scale))
    entries = [{"bbx": np.array(g["bbx"]) * scale, **{k: np.array(g[k], dtype=np.int64) for k in ("easy", "hard", "junk")}}
               for g in GND]
    with (root / f"gnd_{dataset}.pkl").open("wb") as file:
        pickle.dump({"imlist": DATABASE, "qimlist": QUERIES, "gnd": entries}, file)
    return root


def write_r1m(folder: Path, lines: list[str]) -> Path:
    """An R1M folder: ``revisitop1m.txt`` holding ``lines`` and a JPEG under ``jpg/`` for each non-blank
    line (``.jpg`` added to a line without an extension)."""
    (folder / "jpg").mkdir(parents=True)
    for i, line in enumerate(lines):
        name = line.strip()
        if name:
            target = folder / "jpg" / (name if Path(name).suffix else f"{name}.jpg")
            target.parent.mkdir(parents=True, exist_ok=True)
            jpeg_of_noise(target, seed=100 + i)
    (folder / "revisitop1m.txt").write_text("\n".join(lines) + "\n")
    return folder
