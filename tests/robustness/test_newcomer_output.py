"""What a newcomer reads, through the real entry points (issue 14 items 6 and 10): the end of train.py
names the run folder, the checkpoints and an eval command that reproduces the test row; an untrained
model is never called trained; R@k is labelled in percent and a k above the database size is said to
be meaningless; the start-up noise of faiss and Lightning is gone; the export refuses what it would
misname or cannot run, in one line."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest
from entry_helpers import REPO, TINY_TRAIN, error_line, run_entry

#: start-up lines of other libraries that must not reach a user (aggzoo.cli.quiet)
NOISE = ("faiss.loader", "ModuleNotFoundError", "💡", "LeafSpec")


@pytest.fixture(scope="module")
def data_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return {"AGGZOO_DATA": str(tmp_path_factory.mktemp("data"))}


@pytest.fixture(scope="module")
def train_run(tmp_path_factory: pytest.TempPathFactory, data_env: dict[str, str]):
    tmp = tmp_path_factory.mktemp("train")
    result = run_entry(TINY_TRAIN, tmp, env=data_env)
    assert result.returncode == 0, result.stderr[-3000:]
    return result, tmp


def _rows(text: str, benchmark: str) -> list[list[str]]:
    """The printed table rows of ``benchmark`` (cells two or more spaces apart), in order."""
    return [re.split(r"\s{2,}", line.strip()) for line in text.splitlines() if line.startswith(benchmark + " ")]


def _field(stdout: str, name: str) -> str:
    (line,) = [line for line in stdout.splitlines() if line.startswith(name + ":")]
    return line.split(":", 1)[1].strip()


def test_train_ends_with_where_things_are_and_what_to_run(train_run) -> None:
    result, tmp = train_run
    out = result.stdout
    run_dir = Path(_field(out, "run folder"))
    assert run_dir.parent == tmp / "logs" / "train" / "runs" and (run_dir / "run_summary.json").is_file()
    best = _field(out, "best checkpoint")
    assert re.fullmatch(rf"{re.escape(str(run_dir))}/checkpoints/epoch000\.ckpt \(chosen on val/R@1 = \d+\.\d\d %\)", best)
    assert _field(out, "last checkpoint") == str(run_dir / "checkpoints" / "last.ckpt")
    assert Path(_field(out, "results")) == run_dir / "test_results.json"
    assert "R@1 (%)" in out and "R@20 (%)" in out  # the unit is in the header
    # the tiny city has 12 database images: R@20 is the whole database, and the job says so
    assert "note: synthetic_test: recall_ks [20] exceed its 12 database images" in out
    for noise in NOISE:
        assert noise not in result.stdout + result.stderr, noise


def test_the_printed_eval_command_reproduces_the_test_row(train_run, data_env: dict[str, str], tmp_path: Path) -> None:
    result, _ = train_run
    command = shlex.split(_field(result.stdout, "next"))
    assert command[:2] == ["python", "eval.py"] and "synthetic=tiny" in command and "image_size=[48,64]" in command
    evaluated = run_entry(command[2:], tmp_path, script="eval.py", env=data_env)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    (trained,) = _rows(result.stdout, "synthetic_test")  # evaluate_baseline=false: the trained row only
    assert _rows(evaluated.stdout, "synthetic_test") == [trained]
    for noise in NOISE:
        assert noise not in evaluated.stdout + evaluated.stderr, noise


def test_no_training_step_is_not_called_trained(tmp_path: Path, data_env: dict[str, str]) -> None:
    """trainer.max_epochs=0 printed the untrained model under "trained (best checkpoint)"."""
    result = run_entry([*TINY_TRAIN, "trainer.max_epochs=0"], tmp_path, env=data_env)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "note: no training step ran" in out and "== untrained model" in out and "== trained" not in out
    assert _field(out, "last checkpoint") == "none (no training step ran)"
    run_dir = Path(_field(out, "run folder"))
    labels = [row["label"] for row in json.loads((run_dir / "test_results.json").read_text())["results"]]
    summary = json.loads((run_dir / "run_summary.json").read_text())
    assert labels == ["untrained"] and set(summary["test"]) == {"untrained"} and summary["global_step"] == 0


def test_export_of_a_tag_without_its_weights_is_refused(tmp_path: Path) -> None:
    output = tmp_path / "model.pt"
    line = error_line(run_entry(["-m", "aggzoo.cli.export", "netvlad_efficientnet_lite0.nordland_mini", "--format",
                                 "torchscript", "--output", str(output)], tmp_path, script=None))
    assert "names the weights 'nordland_mini', but --pretrained was not given" in line, line
    assert "netvlad_efficientnet_lite0" in line.split("architecture alone")[1] and not output.exists()


def test_onnx_export_without_the_export_extra_names_it(tmp_path: Path) -> None:
    """The README's [cpu] install has neither onnx nor onnxruntime: a site hook hides them here."""
    hook = tmp_path / "hide"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text("import sys\nsys.modules['onnx'] = None\nsys.modules['onnxruntime'] = None\n")
    env = {"PYTHONPATH": f"{hook}:{REPO / 'src'}:{REPO / 'tests'}"}
    line = error_line(run_entry(["-m", "aggzoo.cli.export", "gem_efficientnet_lite0", "--format", "onnx", "--output",
                                 str(tmp_path / "m.onnx")], tmp_path, script=None, env=env))
    assert "--format onnx needs onnx and onnxruntime" in line and 'pip install -e ".[export]"' in line, line


def test_quieting_is_narrow(caplog: pytest.LogCaptureFixture) -> None:
    """Only the named lines go: other warnings, faiss's warnings and Lightning's other info still show."""
    import logging
    import warnings

    from aggzoo.cli.quiet import quiet_startup_noise

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        quiet_startup_noise()
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated", FutureWarning, stacklevel=1)  # from a test: shown
        warnings.warn("something else is deprecated", DeprecationWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["`isinstance(treespec, LeafSpec)` is deprecated",
                                                "something else is deprecated"]
    with caplog.at_level(logging.INFO):
        logging.getLogger("faiss.loader").info("Loading faiss with AVX512 support.")
        logging.getLogger("faiss.loader").warning("a real faiss problem")
        rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
        rank_zero.info("💡 Tip: For seamless cloud logging ...")
        rank_zero.info("GPU available: False, used: False")
    assert [r.getMessage() for r in caplog.records] == ["a real faiss problem", "GPU available: False, used: False"]


def test_the_next_command_names_the_installed_eval_program(monkeypatch: pytest.MonkeyPatch) -> None:
    # An installed wheel has no eval.py: started as the aggzoo-train console script, the job names aggzoo-eval.
    from aggzoo.run.train_report import eval_command

    monkeypatch.setattr(sys, "argv", ["/venv/bin/aggzoo-train"])
    assert eval_command(Path("run/last.ckpt"), ["synthetic_test"], [120, 160]).startswith("aggzoo-eval ckpt_path=")
    monkeypatch.setattr(sys, "argv", ["train.py"])
    assert eval_command(Path("run/last.ckpt"), ["synthetic_test"], [120, 160]).startswith("python eval.py ckpt_path=")
