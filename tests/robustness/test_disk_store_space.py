"""The memory-mapped descriptor store on a disk without room for it (issue 25, point 5): one ``error:`` line that
names the folder and the bytes needed, and no file left behind -- not a bus error (SIGBUS, exit 135) when the
kernel cannot back a page of the memory map, with a partial ``.npy`` filling the disk."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from entry_helpers import error_line, run_entry

from aggzoo.errors import DiskFullError
from aggzoo.evaluation.extraction import open_store

pytestmark = pytest.mark.slow


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 2 MB tmpfs (skipped where this user may not mount one)."""
    folder = tmp_path / "small"
    folder.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(folder)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a size-limited tmpfs here ({done.stderr.strip() or 'mount failed'})")
    try:
        yield folder
    finally:
        if subprocess.run(["umount", str(folder)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(folder)], check=False)  # lazily, if something still holds it


def test_open_store_refuses_what_the_disk_cannot_hold(small_disk: Path) -> None:
    with pytest.raises(DiskFullError) as info:
        open_store(small_disk / "big.npy", np.float32, (1000, 1024))  # 3.9 MiB on a 2 MiB disk
    assert str(small_disk) in str(info.value) and "3.9 MiB" in str(info.value)
    assert list(small_disk.iterdir()) == []
    fits = open_store(small_disk / "small.npy", np.float16, (100, 64))
    fits[:] = 1
    fits.flush()
    del fits  # the open memory map would keep the mount busy
    assert np.load(small_disk / "small.npy").shape == (100, 64)


def test_eval_py_names_the_folder_and_the_bytes(tmp_path: Path, small_disk: Path) -> None:
    # 150 database images x 7168-D float32 = 4.1 MiB: more than the 2 MiB disk holds
    result = run_entry(["model=netvlad_efficientnet_lite0.synthetic", "benchmark=synthetic_test",
                        "evaluation.search.refine=10", "evaluation.search.refine_store=disk",
                        f"evaluation.search.store_dir={small_disk}", "evaluation.outputs.pictures=false"],
                       tmp_path, script="eval.py")
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    line = error_line(result)
    assert f"not enough disk space in {small_disk}" in line and "MiB" in line
    assert "Traceback" not in result.stderr
    assert list(small_disk.iterdir()) == []
