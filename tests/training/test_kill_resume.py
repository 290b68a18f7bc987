"""Never lose a run: a ``python train.py`` SIGKILLed in the middle of an epoch and resumed with
``ckpt_path=last`` ends with the weights, optimiser state and metrics of the same run left alone; a
checkpoint that does not fit the configured model is refused with one clear message."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from train_helpers import TINY, compose_train, logged, run_dirs, train_py

from aggzoo.errors import ConfigError
from aggzoo.run.pipeline import train
from aggzoo.training.checkpointing import CheckpointMismatchError, resolve_ckpt_path

# 24 places / P=6 -> 4 steps per epoch; a checkpoint after every step; 2 epochs.
RUN = [*TINY, "head=gem", "data.places_per_batch=6", "data.image_size=[32,48]", "data.eval_image_size=[32,48]",
       "trainer.max_epochs=2", "evaluate_baseline=false", "+callbacks.model_checkpoint.every_n_train_steps=1",
       "seed=11"]
KILL_AT = 6  # killed while finishing step 6: the newest checkpoint is step 5, batch 1 of epoch 1


def test_sigkilled_run_resumes_to_the_uninterrupted_result(tiny_data, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    logs = tmp_path / "logs"
    killed = train_py([*RUN, f"paths.log_dir={logs}", "+callbacks.crash._target_=faults.KillAtStep",
                       f"+callbacks.crash.step={KILL_AT}"], tiny_data.root)
    assert killed.returncode == -9, killed.stderr[-3000:]
    (run,) = run_dirs(logs)
    state = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")
    assert state["global_step"] == KILL_AT - 1 and state["epoch"] == 1  # mid-epoch
    assert not (run / "test_results.json").exists()

    # Resuming the run folder with another head contradicts the run's saved config (aggzoo.run.resume);
    # the checkpoint file alone, outside its run, refuses a model it does not fit, naming what differs.
    monkeypatch.setenv("AGGZOO_DATA", str(tiny_data.root))
    wrong = [*RUN, "head=netvlad", "++head.num_clusters=4"]
    with pytest.raises(ConfigError, match=r"the override head=netvlad differs from it: head is"):
        train(compose_train([*wrong, f"ckpt_path={run}"], tmp_path / "wrong"))
    shutil.copy(run / "checkpoints" / "last.ckpt", tmp_path / "copy.ckpt")
    with pytest.raises(CheckpointMismatchError, match=r"(?s)head=GeM.*head=NetVLAD.*Fix: resume with"):
        train(compose_train([*wrong, f"ckpt_path={tmp_path / 'copy.ckpt'}"], tmp_path / "wrong"))

    # Resume in this process (a fresh process would rebuild the same objects from the same files).
    resumed = train(compose_train([*RUN, f"paths.log_dir={logs}", "ckpt_path=last"], tmp_path / "resumed"))
    assert resumed["best_checkpoint"].startswith(str(run))  # continued in the interrupted run's folder
    assert not (tmp_path / "resumed" / "checkpoints").exists()

    straight = compose_train([*RUN, f"paths.log_dir={tmp_path / 'straight_logs'}"], tmp_path / "straight")
    train(straight)

    final = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")
    reference = torch.load(tmp_path / "straight" / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")
    assert final["global_step"] == reference["global_step"] == 8
    for key, value in reference["state_dict"].items():
        torch.testing.assert_close(final["state_dict"][key], value, atol=0, rtol=0, msg=key)
    for group_a, group_b in zip(final["optimizer_states"][0]["state"].values(),
                                reference["optimizer_states"][0]["state"].values()):
        torch.testing.assert_close(group_a["exp_avg_sq"], group_b["exp_avg_sq"], atol=0, rtol=0)
    assert final["lr_schedulers"] == reference["lr_schedulers"]
    # Same losses after the restart, same validation and test results.
    resumed_loss, reference_loss = logged(run, "train/loss"), logged(tmp_path / "straight", "train/loss")
    assert {s: v for s, v in resumed_loss.items() if s >= KILL_AT - 1} == \
        {s: v for s, v in reference_loss.items() if s >= KILL_AT - 1}
    assert logged(run, "val/R@1") == logged(tmp_path / "straight", "val/R@1")
    ours = json.loads((run / "run_summary.json").read_text())
    theirs = json.loads((tmp_path / "straight" / "run_summary.json").read_text())
    assert ours["test"] == theirs["test"] and ours["val"] == theirs["val"] and ours["test"]["trained"]


def test_sigterm_saves_the_step_exits_143_and_resumes_to_the_uninterrupted_result(
        tiny_data, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No per-step checkpoints here: only GracefulInterrupt can save the interrupted epoch. The signal
    # comes after GracefulInterrupt's batch-end hook (callback order), so it is saved from on_exception.
    run_args = [a for a in RUN if "every_n_train_steps" not in a]
    logs = tmp_path / "logs"
    stopped = train_py([*run_args, f"paths.log_dir={logs}",
                        "+callbacks.crash._target_=faults.KillAtStep",
                        f"+callbacks.crash.step={KILL_AT}", "+callbacks.crash.signal=SIGTERM"], tiny_data.root)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    (run,) = run_dirs(logs)
    last = run / "checkpoints" / "last.ckpt"
    assert f"interrupted at global step {KILL_AT}: saved {last}" in stopped.stdout
    state = torch.load(last, weights_only=True, map_location="cpu")
    assert state["global_step"] == KILL_AT and state["epoch"] == 1  # the signalled step, mid-epoch
    assert not (run / "test_results.json").exists()

    monkeypatch.setenv("AGGZOO_DATA", str(tiny_data.root))
    train(compose_train([*run_args, f"paths.log_dir={logs}", "ckpt_path=last"], tmp_path / "resumed"))
    train(compose_train([*run_args, f"paths.log_dir={tmp_path / 'straight_logs'}"], tmp_path / "straight"))
    final = torch.load(last, weights_only=True, map_location="cpu")
    reference = torch.load(tmp_path / "straight" / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")
    # (The straight run's second epoch lowers val R@1: its last.ckpt is still the final state, RunCheckpoint.)
    assert final["global_step"] == reference["global_step"] == 8
    for key, value in reference["state_dict"].items():
        torch.testing.assert_close(final["state_dict"][key], value, atol=0, rtol=0, msg=key)
    assert final["lr_schedulers"] == reference["lr_schedulers"]
    assert logged(run, "train/loss") == logged(tmp_path / "straight", "train/loss")
    assert logged(run, "val/R@1") == logged(tmp_path / "straight", "val/R@1")


def test_ckpt_path_resolution(tmp_path: Path) -> None:
    logs = tmp_path / "logs" / "train"
    old, new, own = (logs / "runs" / name / "checkpoints" for name in ("a", "b", "c"))
    for folder in (old, new):
        folder.mkdir(parents=True)
    (old / "last.ckpt").write_bytes(b"0")
    (new / "last.ckpt").write_bytes(b"1")
    later = (old / "last.ckpt").stat().st_mtime + 10
    import os

    os.utime(new / "last.ckpt", (later, later))
    assert resolve_ckpt_path("last", search_root=logs) == new / "last.ckpt"  # the newest run
    assert resolve_ckpt_path(str(old.parent), search_root=logs) == old / "last.ckpt"  # a run folder
    assert resolve_ckpt_path(None, search_root=logs) is None
    assert resolve_ckpt_path("auto", search_root=logs, own_dir=own.parent) is None  # fresh requeueable job
    own.mkdir(parents=True)
    (own / "last.ckpt").write_bytes(b"2")
    assert resolve_ckpt_path("auto", search_root=logs, own_dir=own.parent) == own / "last.ckpt"
    assert resolve_ckpt_path("last", search_root=logs, own_dir=own.parent) == own / "last.ckpt"
    with pytest.raises(FileNotFoundError, match="no checkpoints/last.ckpt under"):
        resolve_ckpt_path("last", search_root=tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="no such checkpoint file"):
        resolve_ckpt_path(tmp_path / "nope.ckpt", search_root=logs)
