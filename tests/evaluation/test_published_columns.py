"""A model's published figures are shown beside ours only on the benchmark they were measured on (issue 25, point
3): pointing the benchmark at other files (``benchmark.<name>.root=``, ``paths.data_root=``,
``paths.shared_data=``) drops the ``published`` / ``delta`` columns, with a note that says why."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from image_files import write_noise_images

from aggzoo.data.retrieval_set import RetrievalSet
from aggzoo.run.evaluate import comparable_published

PUBLISHED = {"nordland_mini/R@1": 34.37, "nordland_mini/R@5": 52.01, "other/R@1": 10.0}


def _set(name: str) -> RetrievalSet:
    return RetrievalSet(name, (Path("d.jpg"),), (Path("q.jpg"),), (np.array([0]),))


def test_figures_stay_while_the_files_are_the_configured_ones(capsys: pytest.CaptureFixture[str]) -> None:
    sets = {"nordland_mini": _set("nordland_mini")}
    assert comparable_published(PUBLISHED, sets, {"model", "benchmark"}) == PUBLISHED
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("moved", ["benchmark.nordland_mini.root", "paths.shared_data", "paths.data_root"])
def test_figures_of_a_moved_benchmark_are_dropped(moved: str, capsys: pytest.CaptureFixture[str]) -> None:
    sets = {"nordland_mini": _set("nordland_mini")}
    assert comparable_published(PUBLISHED, sets, {"model", moved}) == {"other/R@1": 10.0}
    assert f"note: nordland_mini: the model's published figures are not shown: {moved}" in capsys.readouterr().out


def test_another_benchmarks_root_does_not_hide_them(capsys: pytest.CaptureFixture[str]) -> None:
    sets = {"nordland_mini": _set("nordland_mini")}
    assert comparable_published(PUBLISHED, sets, {"benchmark.pitts30k_test.root"}) == PUBLISHED


@pytest.mark.slow
def test_eval_py_on_another_folder_prints_no_published_column(tmp_path: Path) -> None:
    from robustness.entry_helpers import run_entry

    vg = tmp_path / "elsewhere"
    for split in ("database", "queries"):
        folder = vg / "images" / "test" / split
        folder.mkdir(parents=True)
        for i in range(4):  # frames 200 m apart: each query's positive is its own frame
            write_noise_images(folder, 1, (64, 128, 3), seed=i + (10 if split == "queries" else 0),
                               name=f"@0@{7000000 + 200 * i}@32@V@0@0@@@@@@@@.png")
    out = tmp_path / "run"
    result = run_entry(["model=netvlad_efficientnet_lite0.nordland_mini", "benchmark=nordland_mini",
                        f"benchmark.nordland_mini.root={vg}", "evaluation.outputs.pictures=false",
                        f"hydra.run.dir={out}"], tmp_path, script="eval.py")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "published figures are not shown: benchmark.nordland_mini.root" in result.stdout
    header = next(line for line in result.stdout.splitlines() if line.startswith("benchmark"))
    assert "published" not in header and "delta" not in header
    recorded = json.loads((out / "results.json").read_text())["results"][0]
    assert recorded["num_queries"] == 4 and "published" not in recorded
