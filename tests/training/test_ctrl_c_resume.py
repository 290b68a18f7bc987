"""A real Ctrl-C to a real ``python train.py`` (validation and ModelCheckpoint on, as the default
job), a second run started in the folder that run holds, and the resume with ``ckpt_path=last`` and
no other override: issue 14, items 1, 3 and 8.

One interrupted run serves the tests of this module (module fixture); the last test resumes it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from train_helpers import REPO, TINY, compose_train, logged, train_env, train_py

from aggzoo.errors import ConfigError
from aggzoo.run.collect_runs import collect_runs
from aggzoo.run.pipeline import train

# 24 places / P=6 -> 4 steps per epoch, 2 epochs; validation and checkpoints at each epoch's end.
RUN = [*TINY, "head=gem", "data.places_per_batch=6", "data.image_size=[32,48]", "data.eval_image_size=[32,48]",
       "trainer.max_epochs=2", "seed=11"]
CTRL_C_AT = 6  # the SIGINT arrives while step 6 runs: batch 2 of the 4 of epoch 1


@dataclass
class Interrupted:
    logs: Path
    run: Path
    ctrl_c: subprocess.CompletedProcess  # the run Ctrl-C stopped
    second: subprocess.CompletedProcess  # another run started in the same folder while the first ran
    config_before: bytes  # the first run's .hydra/config.yaml before the second started
    summary_while_running: dict  # its run_summary.json while it ran (what a kill -9 then leaves)


@pytest.fixture(scope="module")
def interrupted(tiny_data, tmp_path_factory: pytest.TempPathFactory) -> Interrupted:
    root = tmp_path_factory.mktemp("ctrl_c")
    logs, marker = root / "logs", root / "paused"
    run = logs / "train" / "runs" / "first"
    args = [*RUN, f"paths.log_dir={logs}", f"hydra.run.dir={run}", "+callbacks.pause._target_=faults.PauseAtStep",
            f"+callbacks.pause.step={CTRL_C_AT}", f"+callbacks.pause.marker={marker}"]
    # Its own session, as a terminal's foreground job: the SIGINT goes to its whole process group.
    first = subprocess.Popen([sys.executable, str(REPO / "train.py"), *args], cwd=REPO, env=train_env(tiny_data.root),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not marker.exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), first.communicate(timeout=60)[1][-3000:]
        config_before = (run / ".hydra" / "config.yaml").read_bytes()
        summary = json.loads((run / "run_summary.json").read_text())
        second = train_py([*RUN, "head=netvlad", f"paths.log_dir={logs}", f"hydra.run.dir={run}"], tiny_data.root)
        os.killpg(first.pid, signal.SIGINT)
        out, err = first.communicate(timeout=240)
    finally:
        if first.poll() is None:
            first.kill()
    ctrl_c = subprocess.CompletedProcess(first.args, first.returncode, out, err)
    return Interrupted(logs, run, ctrl_c, second, config_before, summary)


def test_a_second_run_in_a_live_runs_folder_is_refused(interrupted: Interrupted) -> None:
    second = interrupted.second
    assert second.returncode == 2, second.stderr[-3000:]
    errors = [line for line in second.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: the run folder {interrupted.run.resolve()} is in use by another run that is still "
                      f"running ({interrupted.run.resolve() / '.run.lock'} is locked by a live process); wait for it "
                      "to end, or start this run in a folder of its own (leave hydra.run.dir unset, or give another one)"]
    assert "Traceback" not in second.stderr
    # Refused before Hydra wrote anything: the first run's config is still its own (GeM, not NetVLAD).
    assert (interrupted.run / ".hydra" / "config.yaml").read_bytes() == interrupted.config_before
    assert b"GeM" in interrupted.config_before


def test_ctrl_c_mid_epoch_saves_that_step_without_validating_the_partial_epoch(interrupted: Interrupted) -> None:
    stopped, run = interrupted.ctrl_c, interrupted.run
    assert stopped.returncode == 130, stopped.stderr[-3000:]
    last = run / "checkpoints" / "last.ckpt"
    assert f"interrupted at global step {CTRL_C_AT}: saved {last}" in stopped.stdout
    # No top-k save of the partial epoch (epoch 0's best is kept) and no second last file.
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["epoch000.ckpt", "last.ckpt"]
    state = torch.load(last, weights_only=True, map_location="cpu")
    assert state["global_step"] == CTRL_C_AT and state["epoch"] == 1
    assert state["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]["completed"] == 1  # 2nd batch pending
    (validated_at,) = logged(run, "val/R@1")  # after epoch 0 only (its 4 steps), not at step 6
    assert validated_at <= 4
    assert not (run / "test_results.json").exists()


def test_the_baseline_rows_are_on_disk_while_the_run_trains(interrupted: Interrupted) -> None:
    during = interrupted.summary_while_running  # a kill -9 at that moment leaves this file
    assert during["status"].startswith("running or killed") and "trained" not in during["test"]
    assert set(during["test"]) == {"pooling_baseline", "untrained"}
    after = json.loads((interrupted.run / "run_summary.json").read_text())
    assert after["status"].startswith(f"interrupted at global step {CTRL_C_AT}: resume with ckpt_path=")
    assert after["test"] == during["test"]
    (listed,) = collect_runs(interrupted.logs / "train")
    assert listed["status"] == after["status"]


def test_resume_with_ckpt_path_last_alone_uses_the_runs_config_and_ends_as_an_uninterrupted_run(
        interrupted: Interrupted, tiny_data, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGGZOO_DATA", str(tiny_data.root))  # for the uninterrupted run in this process
    logs, run = interrupted.logs, interrupted.run
    # An override that contradicts the run stops with the key named, before anything is built, and
    # leaves no run folder of its own behind (in this process, to spare a start-up: the folder is the
    # one Hydra makes for a command, with its .hydra/; the real train.py resume follows).
    launch = logs / "train" / "runs" / "wrong"
    (launch / ".hydra").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"the override head=netvlad differs from it: head is \{'_target_': "
                                          r"'aggzoo.models.heads.gem.GeM'.*\} there, \{'_target_': "
                                          r"'aggzoo.models.heads.netvlad.NetVLAD'.*Drop the override"):
        train(compose_train([f"paths.log_dir={logs}", "ckpt_path=last", "head=netvlad"], launch))
    assert [p.name for p in (logs / "train" / "runs").iterdir()] == ["first"]

    resumed = train_py([f"paths.log_dir={logs}", "ckpt_path=last"], tiny_data.root)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # The resuming command's own Hydra folder is gone (its log moved into the run): one run to list.
    assert [p.name for p in (logs / "train" / "runs").iterdir()] == ["first"]
    assert len(list(run.glob("train.*.log"))) == 1
    assert [r["status"] for r in collect_runs(logs / "train")] == ["done"]

    train(compose_train([*RUN, f"paths.log_dir={tmp_path / 'straight_logs'}"], tmp_path / "straight"))
    final = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")
    reference = torch.load(tmp_path / "straight" / "checkpoints" / "last.ckpt", weights_only=True,
                           map_location="cpu")
    assert final["global_step"] == reference["global_step"] == 8
    for key, value in reference["state_dict"].items():
        torch.testing.assert_close(final["state_dict"][key], value, atol=0, rtol=0, msg=key)
    assert final["lr_schedulers"] == reference["lr_schedulers"]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == \
        sorted(p.name for p in (tmp_path / "straight" / "checkpoints").iterdir())  # no last-v1.ckpt
    assert logged(run, "train/loss") == logged(tmp_path / "straight", "train/loss")
    assert logged(run, "val/R@1") == logged(tmp_path / "straight", "val/R@1")
    ours = json.loads((run / "run_summary.json").read_text())
    theirs = json.loads((tmp_path / "straight" / "run_summary.json").read_text())
    # Same recalls, the baseline rows carried over from the run's start; the run's own overrides.
    assert ours["test"] == theirs["test"] and set(ours["test"]) == {"pooling_baseline", "untrained", "trained"}
    assert ours["status"] == "done" and ours["head"] == "gem" and "head=gem" in ours["overrides"]
    # test_results.json of the resumed run holds the baseline rows too (issue 25, point 16), as the straight run's.
    mine = json.loads((run / "test_results.json").read_text())["results"]
    straight = json.loads((tmp_path / "straight" / "test_results.json").read_text())["results"]
    assert [r["label"] for r in mine] == [r["label"] for r in straight] == ["pooling_baseline", "untrained", "trained"]
    assert [r["recalls"] for r in mine] == [r["recalls"] for r in straight]
