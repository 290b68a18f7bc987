"""One live run per run folder: the lock holds against a live process and not against a dead one
(``kill -9`` leaves the lock file behind), run folders are named to the microsecond, and a folder
with nothing of a run in it is removed. (Two real ``python train.py`` on one folder:
tests/training/test_ctrl_c_resume.py.)"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from filelock import FileLock
from hydra import compose, initialize_config_dir

from aggzoo.errors import RunFolderError
from aggzoo.run.run_folder import LOCK_NAME, discard_unused_run_folder, hold_run_folder, release_run_folder

REPO = Path(__file__).resolve().parents[2]
HOLD = "import sys, time; from aggzoo.run.run_folder import hold_run_folder; hold_run_folder(sys.argv[1]); " \
       "print('held', flush=True); time.sleep(120)"


def _holder(folder: Path) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "held"
    return process


def test_a_live_holder_blocks_and_a_killed_one_does_not(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    holder = _holder(folder)
    try:
        with pytest.raises(RunFolderError, match=rf"the run folder {re.escape(str(folder))} is in use by another run "
                                                 "that is still running"):
            hold_run_folder(folder)
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    assert (folder / LOCK_NAME).exists()  # left behind by the killed process, and stale:
    assert hold_run_folder(folder) == folder.resolve()
    assert hold_run_folder(folder) == folder.resolve()  # the same process may hold it twice
    release_run_folder(folder)
    release_run_folder(folder)
    FileLock(str(folder / LOCK_NAME)).acquire(timeout=0)  # released (a lock of its own would fail here)


def test_two_launches_in_the_same_second_get_two_run_folders(tmp_path: Path) -> None:
    folders = []
    for _ in range(2):
        with initialize_config_dir(str(REPO / "conf"), version_base="1.3"):
            cfg = compose("train", overrides=[f"paths.log_dir={tmp_path}"], return_hydra_config=True)
        folders.append(str(cfg.hydra.run.dir))
        time.sleep(0.002)
    assert folders[0] != folders[1]
    assert all(re.fullmatch(rf"{re.escape(str(tmp_path))}/train/runs/\d{{4}}-\d\d-\d\d_\d\d-\d\d-\d\d-\d{{6}}", f)
               for f in folders)


def test_only_a_folder_with_nothing_of_a_run_is_discarded(tmp_path: Path) -> None:
    def hydra_folder(name: str, *extra: str) -> Path:
        folder = tmp_path / name
        (folder / ".hydra").mkdir(parents=True)
        (folder / ".hydra" / "config.yaml").write_text("seed: 0\n")
        (folder / "train.log").write_text("started\n")
        for item in extra:
            (folder / item).parent.mkdir(parents=True, exist_ok=True)
            (folder / item).write_text("x")
        return folder

    failed = hydra_folder("failed", LOCK_NAME)
    resumed_into = tmp_path / "the_run"
    resumed_into.mkdir()
    assert discard_unused_run_folder(failed, keep_log_in=resumed_into) and not failed.exists()
    assert (resumed_into / "train.failed.log").read_text() == "started\n"
    trained = hydra_folder("trained", "checkpoints/last.ckpt")
    assert not discard_unused_run_folder(trained) and (trained / "checkpoints" / "last.ckpt").exists()
    plain = tmp_path / "not_hydra"
    plain.mkdir()
    (plain / "notes.log").write_text("mine")
    assert not discard_unused_run_folder(plain) and (plain / "notes.log").exists()
