"""Entry points print a user's error as one line and exit with status 2; bugs keep their traceback."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from aggzoo.cli.reporting import reported_user_errors
from aggzoo.data.image_policy import ImagePolicy
from aggzoo.data.retrieval_set import ImageListDataset
from aggzoo.run.preflight import PreflightError, after_training
from aggzoo.training.interrupt import GracefulInterrupt


def test_user_error_is_one_line_and_status_two(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as info, reported_user_errors():
        raise PreflightError("cannot start training: data.places_per_batch=8 but ...")
    assert info.value.code == 2
    assert capsys.readouterr().err == "error: cannot start training: data.places_per_batch=8 but ...\n"


def test_error_from_a_loader_worker_is_reduced_to_its_message(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "x.jpg").write_text("text")
    loader = DataLoader(ImageListDataset([tmp_path / "x.jpg"], torch.as_tensor), num_workers=1)
    with pytest.raises(SystemExit), reported_user_errors():
        next(iter(loader))
    assert capsys.readouterr().err == (f"error: cannot read image {tmp_path / 'x.jpg'}: not an image Pillow can "
                                       "identify (corrupt, or not an image despite its extension)\n")


def test_disk_full_anywhere_and_bugs(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit), reported_user_errors():
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/runs/x/results.json")
    assert capsys.readouterr().err == ("error: disk full while writing /runs/x/results.json (No space left on device). "
                                       "Free some space or write to a larger disk (paths.output_dir=...); a training "
                                       "run resumes with ckpt_path=last.\n")
    with pytest.raises(SystemExit) as info, reported_user_errors():
        raise PermissionError(errno.EROFS, os.strerror(errno.EROFS), "/runs/x/checkpoints/last.ckpt")
    assert info.value.code == 2
    assert capsys.readouterr().err == ("error: permission denied: /runs/x/checkpoints/last.ckpt (Read-only file system). "
                                       "Make it writable (readable, for data) by this user, or point the job elsewhere: "
                                       "paths.log_dir=<folder> for what a run writes, paths.data_root=<folder> for the "
                                       "datasets.\n")
    with pytest.raises(PermissionError), reported_user_errors():
        raise PermissionError(errno.EACCES, "denied")  # no file named: a bug's traceback is the only clue
    with pytest.raises(KeyError), reported_user_errors():
        raise KeyError("a bug keeps its traceback")


class _Trainer:
    def __init__(self, callbacks: list, step: int) -> None:
        self.callbacks, self.global_step = callbacks, step


def test_after_training_reports_interruption_and_skipped_images(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    policy = ImagePolicy("skip", log_path=tmp_path / "bad_images.tsv")
    policy.record(tmp_path / "a.jpg", "empty file (0 bytes)")
    policy.record("place:7", "fewer than 4 readable images; replaced by place 8")
    interrupt = GracefulInterrupt()
    interrupt.saved_path = tmp_path / "checkpoints" / "interrupted.ckpt"
    out = after_training(_Trainer([interrupt], 42), policy)
    assert out["interrupted"] == str(interrupt.saved_path) and set(out["bad_images"]) == {str(tmp_path / "a.jpg"), "place:7"}
    printed = capsys.readouterr().out.splitlines()
    assert printed == [
        f"note: skipped 1 unreadable training images and replaced 1 places left with too few readable images; "
        f"listed in {tmp_path / 'bad_images.tsv'}",
        f"interrupted at global step 42: saved {interrupt.saved_path}; no test evaluation. "
        f"Resume with ckpt_path={interrupt.saved_path}"]
    assert after_training(_Trainer([GracefulInterrupt()], 3), ImagePolicy("skip")) == {}
