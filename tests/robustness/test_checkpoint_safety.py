"""Checkpoints: a save killed midway (exception, SIGKILL) leaves the previous file intact; a full
disk is reported with the fix."""

from __future__ import annotations

import errno
import io
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from robust_helpers import TinyData, TinyModule, tiny_trainer, write_city

import aggzoo.training.checkpointing as durable_io
import aggzoo.training.checkpointing as safe_save
from aggzoo.training.checkpointing import DiskFullError, DurableCheckpointIO, RunCheckpoint, atomic_save


def _half_then(error: BaseException):
    """A ``torch.save`` that writes the first half of the real bytes, then fails."""

    def save(obj: Any, handle: Any) -> None:
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        data = buffer.getvalue()
        handle.write(data[: len(data) // 2])
        handle.flush()
        raise error

    return save


def _failing_atomic_save(error: BaseException):
    real = safe_save.atomic_save

    def save(obj: Any, path: Any, **kwargs: Any) -> None:
        real(obj, path, save=_half_then(error))

    return save


def test_exception_midway_keeps_the_previous_file(tmp_path: Path) -> None:
    target = tmp_path / "last.ckpt"
    atomic_save({"step": 1, "w": torch.arange(1000.0)}, target)
    before = target.read_bytes()
    with pytest.raises(RuntimeError, match="power cut"):
        atomic_save({"step": 2, "w": torch.zeros(1000)}, target, save=_half_then(RuntimeError("power cut")))
    assert target.read_bytes() == before
    assert torch.load(target, weights_only=True)["step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]  # no partial file left


def test_disk_full_is_reported_and_the_previous_file_kept(tmp_path: Path) -> None:
    target = tmp_path / "last.ckpt"
    atomic_save({"w": torch.ones(10)}, target)
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    with pytest.raises(DiskFullError) as info:
        atomic_save({"w": torch.zeros(256, 1024)}, target, save=_half_then(full))
    message = str(info.value)
    assert message.startswith(f"[Errno {errno.ENOSPC}] disk full while writing {target} (No space left on device; ")
    assert "free on that file system, the file needs at least 1.0 MB). The previous last.ckpt is intact." in message
    assert "paths.output_dir=" in message and "ckpt_path=" in message
    assert torch.equal(torch.load(target, weights_only=True)["w"], torch.ones(10))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_sigkill_midway_keeps_the_previous_file_and_the_next_save_cleans_up(tmp_path: Path) -> None:
    target, marker = tmp_path / "last.ckpt", tmp_path / "half_written"
    atomic_save({"step": 1}, target)
    before = target.read_bytes()
    child = textwrap.dedent(f"""
        import io, time, torch
        from pathlib import Path
        from aggzoo.training.checkpointing import atomic_save
        def slow(obj, handle):
            buffer = io.BytesIO(); torch.save(obj, buffer); data = buffer.getvalue()
            handle.write(data[: len(data) // 2]); handle.flush()
            Path({str(marker)!r}).touch()
            time.sleep(60)
            handle.write(data[len(data) // 2:])
        atomic_save({{"step": 2, "w": torch.zeros(100000)}}, {str(target)!r}, save=slow)
    """)
    process = subprocess.Popen([sys.executable, "-c", child])
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert process.poll() is None and time.monotonic() < deadline, "the child never started writing"
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert target.read_bytes() == before
    partials = [p for p in tmp_path.iterdir() if p.name.startswith(".last.ckpt.partial-")]
    assert len(partials) == 1 and partials[0].stat().st_size > 0  # the killed writer's half file
    atomic_save({"step": 3}, target)
    assert torch.load(target, weights_only=True)["step"] == 3
    assert not any(p.name.startswith(".last.ckpt.partial-") for p in tmp_path.iterdir())


def test_trainer_save_failing_midway_keeps_last_ckpt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "city"
    write_city(root, [2] * 6)
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, every_n_train_steps=1, save_top_k=0)
    trainer = tiny_trainer(tmp_path, [checkpoints], max_steps=2, enable_checkpointing=True,
                           plugins=[DurableCheckpointIO()])
    trainer.fit(TinyModule(), datamodule=TinyData(root))
    last = tmp_path / "ckpt" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 2
    before = last.read_bytes()
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(durable_io, "atomic_save", _failing_atomic_save(full))
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, every_n_train_steps=1, save_top_k=0)
    trainer = tiny_trainer(tmp_path, [checkpoints], max_steps=4, enable_checkpointing=True,
                           plugins=[DurableCheckpointIO()])
    with pytest.raises(DiskFullError, match=r"disk full while writing .*last\.ckpt.*The previous last\.ckpt is intact"):
        trainer.fit(TinyModule(), datamodule=TinyData(root), ckpt_path=str(last))
    assert last.read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["last.ckpt"]


class WorseEveryEpoch(TinyModule):
    """Logs a monitored score that never improves after the first epoch."""

    def on_train_epoch_end(self) -> None:
        self.log("score", -float(self.current_epoch))


@pytest.mark.parametrize("callback", [ModelCheckpoint, RunCheckpoint])
def test_last_ckpt_is_the_final_state_even_when_the_monitored_metric_stops_improving(
        callback: type[ModelCheckpoint], tmp_path: Path) -> None:
    root = tmp_path / "city"
    write_city(root, [2] * 4)  # 2 steps per epoch
    checkpoints = callback(dirpath=tmp_path / "ckpt", monitor="score", mode="max", save_top_k=1, save_last=True)
    trainer = tiny_trainer(tmp_path, [checkpoints], max_epochs=3, enable_checkpointing=True)
    trainer.fit(WorseEveryEpoch(), datamodule=TinyData(root))
    last = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    best = torch.load(checkpoints.best_model_path, weights_only=True)
    assert best["global_step"] == 2  # the best epoch is the first, for both
    # Lightning 2.6 refreshes last.ckpt only together with a top-k save; RunCheckpoint at every epoch.
    assert last["global_step"] == (6 if callback is RunCheckpoint else 2)
    # Both file their state under ModelCheckpoint's key, so either resumes the other's runs.
    (key,) = [k for k in last["callbacks"] if "Checkpoint" in k]
    assert key.startswith("ModelCheckpoint{")
    assert last["callbacks"][key]["best_model_path"] == checkpoints.best_model_path
