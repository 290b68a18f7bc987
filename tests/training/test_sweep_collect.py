"""A real ``python train.py -m head=...`` sweep: every job runs, a failed one is listed, and the sweep ends
with the comparison table that the collect command also prints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict
from train_helpers import CONF, TINY, train_py

from aggzoo.run.collect_runs import collect_runs, format_runs, main
from aggzoo.run.sweep import keep_sweeping


def test_sweep_then_collect_gives_one_row_per_head(tiny_data, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # A plain launch (no paths override, AGGZOO_ROOT unset): the sweep folder goes under <launch dir>/logs.
    logs = tmp_path / "logs"
    # MixVPR needs 20x20 maps; test_resnet at 48x64 gives 3x4, so the middle job fails on a user error.
    sweep = train_py(["-m", "head=gem,mixvpr,avgpool", *TINY, "data.places_per_batch=6", "trainer.max_epochs=1",
                      "trainer.limit_train_batches=3", "benchmark@val_benchmarks=[]"], tiny_data.root,
                     launch_dir=tmp_path)
    # The failure did not stop the sweep, which ends with its table and a non-zero status naming the run.
    assert sweep.returncode == 1, sweep.stderr[-3000:]
    assert "1 of 3 sweep runs did not finish: run 1 (head=mixvpr)" in sweep.stderr
    (sweep_dir,) = (logs / "train" / "multiruns").iterdir()
    printed = sweep.stdout[sweep.stdout.index("== sweep "):].splitlines()[1:]
    assert printed == (sweep_dir / "sweep_results.md").read_text().splitlines()

    runs = collect_runs(sweep_dir)
    assert [r["run"] for r in runs] == ["0", "1", "2"]
    gem, mixvpr, avg = runs
    assert gem["status"] == avg["status"] == "done"
    assert mixvpr["status"].startswith("failed: cannot start training: head MixVPR cannot aggregate")
    assert (sweep_dir / "1" / "run_error.txt").read_text().startswith(mixvpr["status"].removeprefix("failed: "))
    assert (gem["head"], avg["head"]) == ("gem", "avgpool")  # the conf/head names the sweep used
    assert (gem["head_class"], avg["head_class"]) == ("GeM", "AvgPool")
    assert gem["descriptor_dim"] == avg["descriptor_dim"] == 192  # test_resnet layer3 channels
    assert gem["trainable_params"] == avg["trainable_params"] + 1  # GeM's p
    assert gem["global_step"] == avg["global_step"] == 3 and gem["seconds_per_step"] > 0
    pooling, untrained, trained = json.loads((sweep_dir / "0" / "test_results.json").read_text())["results"]
    # labelled as run_summary.json labels them (issue 14 item 6: three rows all named synthetic_test)
    assert [r["label"] for r in (pooling, untrained, trained)] == ["pooling_baseline", "untrained", "trained"]
    assert gem["test"]["trained"]["synthetic_test"] == trained["recalls"]
    assert gem["test"]["untrained"]["synthetic_test"] == untrained["recalls"]
    assert gem["test"]["pooling_baseline"]["synthetic_test"] == pooling["recalls"]

    assert main([str(sweep_dir), "--sort", "R@1"]) == 0
    table = capsys.readouterr().out.splitlines()
    header = [c.strip() for c in table[0].strip("|").split("|")]
    assert header[:8] == ["run", "changes", "head", "D", "params (M)", "trainable (M)", "s/step", "img/s"]
    # Recall@k in percent, labelled as the evaluation report labels it (issue 14 item 10)
    assert {"synthetic_test R@1 (%)", "synthetic_test untrained R@1 (%)",
            "synthetic_test avg-pool baseline R@1 (%)"} <= set(header)
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table[2:]]
    assert sorted(row[1] for row in rows) == ["head=avgpool", "head=gem", "head=mixvpr"]  # what the sweep varied
    assert printed[2:] == table[2:]  # the sweep's own table is the collect command's, sorted by R@1
    r1 = header.index("synthetic_test R@1 (%)")
    assert [row[r1] for row in rows][-1] == ""  # the failed run sorts last, without metrics
    values = [float(row[r1]) for row in rows[:-1]]
    assert values == sorted(values, reverse=True)
    assert set(values) == {round(100 * r["test"]["trained"]["synthetic_test"]["1"], 2)
                                                for r in (gem, avg)}
    # the column named with its unit sorts the same; a name that is no column is refused
    assert format_runs(runs, sort="synthetic_test R@1 (%)").splitlines()[2:] == table[2:]
    with pytest.raises(ValueError, match="no such column"):
        format_runs(runs, sort="R@3")


def test_collect_lists_runs_without_summary_and_rejects_empty_folders(tmp_path: Path) -> None:
    (tmp_path / "0" / ".hydra").mkdir(parents=True)
    (tmp_path / "0" / ".hydra" / "config.yaml").write_text("{}\n")
    (tmp_path / "0" / ".hydra" / "overrides.yaml").write_text("- head=salad\n")
    (runs,) = [collect_runs(tmp_path)]
    assert runs[0]["status"].startswith("no summary") and runs[0]["overrides"] == ["head=salad"]
    assert "head=salad" in format_runs(runs, fmt="csv")
    with pytest.raises(FileNotFoundError, match="no runs under"):
        collect_runs(tmp_path / "0" / ".hydra")


def test_a_sweep_whose_every_job_fails_still_prints_its_table_and_fails(tiny_data, tmp_path: Path) -> None:
    sweep = train_py(["-m", "head=mixvpr", *TINY], tiny_data.root, launch_dir=tmp_path)
    assert sweep.returncode == 1
    assert "1 of 1 sweep runs did not finish: run 0 (head=mixvpr" in sweep.stderr
    assert "| 0 | " in sweep.stdout and "failed: cannot start training" in sweep.stdout


def _hydra_job(mode: str, output_dir: Path) -> None:
    """Make this process look like a Hydra job of the given run mode writing to ``output_dir``."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=[f"hydra.mode={mode}"], return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(output_dir)
    HydraConfig().set_config(cfg)


def test_a_bug_in_a_sweep_job_is_recorded_with_its_traceback_and_propagates_in_a_single_run(tmp_path: Path) -> None:
    _hydra_job("MULTIRUN", tmp_path)
    with keep_sweeping():
        raise RuntimeError("first line\nsecond line")  # swallowed: the sweep goes on
    reason, blank, *traceback = (tmp_path / "run_error.txt").read_text().splitlines()
    assert reason == "RuntimeError: first line second line" and blank == ""
    assert traceback[0].startswith("Traceback") and "test_sweep_collect.py" in "\n".join(traceback)

    _hydra_job("RUN", tmp_path / "single")
    with pytest.raises(RuntimeError, match="first line"), keep_sweeping():
        raise RuntimeError("first line")
    assert not (tmp_path / "single").exists()


def test_an_eval_sweep_lists_each_run_with_its_recall_and_keeps_going(tiny_data, tmp_path: Path) -> None:
    """``python eval.py -m``: untrained GeM and average pooling, and MixVPR, which fails on these maps."""
    sweep = train_py(["-m", "head=gem,mixvpr,avgpool", "synthetic=tiny", "backbone=test_resnet",
                      "backbone.pretrained=false", "image_size=[48,64]"], tiny_data.root, launch_dir=tmp_path,
                     script="eval.py", timeout=300)
    assert sweep.returncode == 1, sweep.stderr[-3000:]
    assert "1 of 3 sweep runs did not finish: run 1 (head=mixvpr)" in sweep.stderr
    (sweep_dir,) = (tmp_path / "logs" / "eval" / "multiruns").iterdir()
    runs = collect_runs(sweep_dir)
    assert [r["status"] for r in runs][::2] == ["done", "done"] and runs[1]["status"].startswith("failed: ")
    for run in runs[::2]:
        results = json.loads((sweep_dir / run["run"] / "results.json").read_text())["results"]
        assert run["test"]["trained"]["synthetic_test"] == results[0]["recalls"]
    lines = (sweep_dir / "sweep_results.md").read_text().splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    # eval runs have no training columns and no baselines: only what some run filled
    assert header == ["run", "changes", "synthetic_test R@1 (%)", "synthetic_test R@5 (%)", "synthetic_test R@10 (%)",
                      "status"]
