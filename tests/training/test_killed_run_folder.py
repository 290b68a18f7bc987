"""A killed run's folder is never taken over: after ``kill -9`` of a real ``python train.py`` given
``hydra.run.dir=X``, another training with other overrides in ``X`` is refused with one ``error:``
line before anything of the killed run is overwritten, and the killed run still resumes, in ``X``,
with its own config (issue 25, point 1)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from train_helpers import TINY, train_py

RUN = [*TINY, "head=gem", "data.places_per_batch=6", "data.image_size=[32,48]", "data.eval_image_size=[32,48]",
       "trainer.max_epochs=2", "evaluate_baseline=false", "+callbacks.model_checkpoint.every_n_train_steps=1",
       "seed=11"]
KILL_AT = 6


def _error_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


def test_a_killed_runs_folder_is_refused_to_a_new_run_and_the_run_still_resumes(tiny_data, tmp_path: Path) -> None:
    logs, run = tmp_path / "logs", tmp_path / "logs" / "train" / "runs" / "kept"
    killed = train_py([*RUN, f"paths.log_dir={logs}", f"hydra.run.dir={run}",
                       "+callbacks.crash._target_=faults.KillAtStep", f"+callbacks.crash.step={KILL_AT}"],
                      tiny_data.root)
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert (run / "checkpoints" / "last.ckpt").is_file()
    record = {name: (run / ".hydra" / name).read_bytes() for name in ("overrides.yaml", "config.yaml", "hydra.yaml")}
    last_before = (run / "checkpoints" / "last.ckpt").read_bytes()

    # Another training (other head) given the dead run's folder: refused, nothing of the run touched.
    other = train_py([*RUN, "head=netvlad", f"paths.log_dir={logs}", f"hydra.run.dir={run}"], tiny_data.root)
    assert other.returncode == 2, other.stderr[-3000:]
    assert _error_lines(other) == [
        f"error: the run folder {run.resolve()} holds a training run (checkpoints, run_summary.json) that this command does not "
        "resume; starting another job there would overwrite that run's saved config. Resume it with "
        f"ckpt_path={run.resolve()} (its own config is used), or start this job in a folder of its own (leave "
        "hydra.run.dir unset, or give another one)"], other.stderr[-3000:]
    assert "Traceback" not in other.stderr
    assert {name: (run / ".hydra" / name).read_bytes() for name in record} == record
    assert (run / "checkpoints" / "last.ckpt").read_bytes() == last_before
    # An evaluation in it would overwrite the run's .hydra/ as well.
    evaluation = train_py(["synthetic=tiny", "backbone=test_resnet", "image_size=[32,48]", f"paths.log_dir={logs}",
                           f"hydra.run.dir={run}"], tiny_data.root, script="eval.py")
    assert evaluation.returncode == 2 and len(_error_lines(evaluation)) == 1, evaluation.stderr[-3000:]
    assert {name: (run / ".hydra" / name).read_bytes() for name in record} == record

    # The command that resumes the run, in the run's own folder: accepted, the run's record kept.
    resumed = train_py([f"paths.log_dir={logs}", f"hydra.run.dir={run}",
                        f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}"], tiny_data.root)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (run / ".hydra" / "overrides.yaml").read_bytes() == record["overrides.yaml"]
    assert "head=gem" in yaml.safe_load(record["overrides.yaml"])
    summary = json.loads((run / "run_summary.json").read_text())
    assert summary["status"] == "done" and summary["global_step"] == 8 and summary["head"] == "gem"
    assert (run / "test_results.json").is_file()
