"""The metric-learning protocol end to end: ``eval.py benchmark=my_classes`` on a class folder of real JPEGs prints
Recall@k and MAP@R / R-Precision, and the recorded figures equal pytorch-metric-learning's ``AccuracyCalculator``
on the descriptors the run saved (every image a query against all the others, itself excluded)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from class_labelled_files import write_class_folder
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
from robustness.entry_helpers import TINY_EVAL, error_line, run_entry

from aggzoo.data.class_folder import read_class_folder

pytestmark = pytest.mark.slow


def test_eval_py_prints_and_records_the_metric_learning_metrics(tmp_path: Path) -> None:
    root = write_class_folder(tmp_path / "birds", {"crow": 4, "finch": 3, "gull": 5, "heron": 2, "owl": 4})
    out = tmp_path / "run"
    result = run_entry([*TINY_EVAL, "benchmark=my_classes", f"benchmark.my_classes.root={root}", "recall_ks=[1,2,4]",
                        "evaluation.outputs.save_descriptors=true", "evaluation.outputs.save_predictions=true",
                        f"hydra.run.dir={out}"], tmp_path, script="eval.py")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    recall_header = next(line for line in lines if line.startswith("benchmark") and "R@1 (%)" in line)
    metric_header = next(line for line in lines if line.startswith("benchmark") and "setup" in line)
    assert "R@4 (%)" in recall_header and "MAP@R (%)" in metric_header and "R-Precision (%)" in metric_header
    assert any(line.split()[:4] == ["my_classes", "all", "18", "18"] for line in lines)
    assert "occur more than once" not in result.stderr  # 0.jpg in every class folder is no second extraction

    recorded = json.loads((out / "results.json").read_text())["results"][0]
    saved = np.load(out / "descriptors_my_classes.npz")
    assert np.array_equal(saved["database"], saved["queries"])  # one extraction, queries are the database
    labels = read_class_folder(root).labels
    predictions = np.load(out / "predictions_my_classes.npy")
    assert predictions.shape == (18, 4) and not (predictions == np.arange(18)[:, None]).any()  # never itself

    calculator = AccuracyCalculator(include=("precision_at_1", "r_precision", "mean_average_precision_at_r"), k=None)
    theirs = calculator.get_accuracy(torch.from_numpy(saved["database"]), torch.from_numpy(labels),
                                     torch.from_numpy(saved["database"]), torch.from_numpy(labels),
                                     ref_includes_query=True)
    assert recorded["metrics"]["all/MAP@R"] == pytest.approx(theirs["mean_average_precision_at_r"], abs=1e-6)
    assert recorded["metrics"]["all/R-Precision"] == pytest.approx(theirs["r_precision"], abs=1e-6)
    assert recorded["recalls"]["1"] == pytest.approx(theirs["precision_at_1"], abs=1e-6)
    row = next(line for line in lines if line.split()[:2] == ["my_classes", "all"])
    assert row.split()[-2:] == [f"{100 * recorded['metrics']['all/MAP@R']:.2f}",
                                f"{100 * recorded['metrics']['all/R-Precision']:.2f}"]


def test_eval_py_on_a_missing_metric_learning_set_says_the_layout(tmp_path: Path) -> None:
    result = run_entry([*TINY_EVAL, "benchmark=cub200"], tmp_path, script="eval.py")
    line = error_line(result)
    assert "CUB_200_2011/images.txt" in line and "caltech.edu" in line and str(tmp_path / "data" / "cub200") in line
