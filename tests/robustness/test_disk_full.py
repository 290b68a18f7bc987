"""A full disk is one ``error:`` line naming the folder and the space, on a real size-limited file
system (a tmpfs mounted for the test; skipped where this user may not mount one): during training
(the checkpoint writer, where torch's zip writer turns the write error into its own RuntimeError),
and before a job starts (where Hydra writes the run's ``.hydra/`` before any of aggzoo's code runs).
The last good ``last.ckpt`` survives, and no partial file is left (issue 25, point 6)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from entry_helpers import TINY_EVAL, TINY_TRAIN, error_line, run_entry


def _mount(folder: Path, size: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a size-limited tmpfs here ({done.stderr.strip() or 'mount failed'})")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 3 MB tmpfs: room for two checkpoints of the tiny model (1.3 MB each), not a third."""
    folder = tmp_path / "small_disk"
    _mount(folder, "3m")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MB tmpfs filled to the last byte."""
    folder = tmp_path / "full_disk"
    _mount(folder, "1m")
    try:
        with (folder / "filler").open("wb") as handle:
            try:
                while True:
                    handle.write(b"\0" * 65536)
                    handle.flush()
            except OSError:
                pass
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)


def test_a_full_disk_during_training_is_one_error_line_and_last_ckpt_survives(small_disk: Path,
                                                                               tmp_path: Path) -> None:
    logs = small_disk / "logs"
    result = run_entry([*[a for a in TINY_TRAIN if not a.startswith("trainer.max_epochs")], "trainer.max_epochs=3",
                        f"paths.log_dir={logs}"], tmp_path)
    line = error_line(result)
    (run,) = (logs / "train" / "runs").iterdir()
    checkpoints = run / "checkpoints"
    assert line.startswith(f"error: disk full while writing {checkpoints}/"), line
    assert "free on that file system, the file needs at least" in line and "is intact" in line, line
    assert not [p.name for p in checkpoints.iterdir() if ".partial-" in p.name]  # removed on the failure path
    state = torch.load(checkpoints / "last.ckpt", weights_only=True, map_location="cpu")
    assert state["global_step"] > 0 and "state_dict" in state


@pytest.mark.parametrize("script", ["eval.py", "train.py"])
def test_a_full_disk_at_the_start_is_one_error_line_naming_the_folder(full_disk: Path, tmp_path: Path,
                                                                      script: str) -> None:
    logs = full_disk / "logs"
    os.makedirs(logs, exist_ok=True)  # a folder needs no data blocks on tmpfs
    args = TINY_EVAL if script == "eval.py" else TINY_TRAIN
    line = error_line(run_entry([*args, f"paths.log_dir={logs}"], tmp_path, script=script))
    task = "eval" if script == "eval.py" else "train"
    assert line.startswith(f"error: no space left for the run folder in {logs / task / 'runs'}: 0.0 MB free on "
                           "that file system, a run needs at least 1.0 MB to start"), line
    assert line.endswith("write the logs to a larger disk with paths.log_dir=<folder>"), line
