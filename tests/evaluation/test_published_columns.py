"""A model's published figures (Recall@k, and mAP per setup: issue 23) are shown beside ours only on the benchmark
they were measured on (issue 25, point 3): pointing the benchmark at other files (``benchmark.<name>.root=``, ``paths.data_root=``,
``paths.shared_data=``) drops the ``published`` / ``delta`` columns, with a note that says why."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from image_files import write_noise_images

from aggzoo.data.retrieval_set import RetrievalSet
from aggzoo.evaluation.report import published_figures, published_setup_figures
from aggzoo.hub.cfg import split_metric_key
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


# -- per-setup figures (revisited Oxford / Paris mAP: issue 23) ---------------------------------------

SETUP_FIGURES = {"roxford5k/medium/mAP": 60.0, "roxford5k/hard/mAP": 40.0, "roxford5k/hard/mP@10": 30.0,
                 "rparis6k/medium/mAP": 70.0}


def test_metric_keys_name_their_benchmark_setup_and_metric() -> None:
    assert split_metric_key("roxford5k/medium/mAP") == ("roxford5k", "medium", "mAP")
    assert split_metric_key("rparis6k/hard/mP@10") == ("rparis6k", "hard", "mP@10")
    assert split_metric_key("pitts30k_test/R@1") == ("pitts30k_test", None, "R@1")
    # a benchmark name with a slash keeps it; a middle part that is not a setup belongs to the benchmark
    assert split_metric_key("msls/val/R@5") == ("msls/val", None, "R@5")
    assert split_metric_key("R@1") == ("", None, "R@1")


def test_setup_figures_are_kept_or_dropped_with_their_benchmark(capsys: pytest.CaptureFixture[str]) -> None:
    sets = {"roxford5k": _set("roxford5k")}
    assert comparable_published(SETUP_FIGURES, sets, {"model"}) == SETUP_FIGURES
    kept = comparable_published(SETUP_FIGURES, sets, {"benchmark.roxford5k.root"})
    assert kept == {"rparis6k/medium/mAP": 70.0}
    assert "note: roxford5k: the model's published figures are not shown" in capsys.readouterr().out
    assert published_setup_figures(SETUP_FIGURES, ("roxford5k",)) == {"medium/mAP": 60.0, "hard/mAP": 40.0,
                                                                        "hard/mP@10": 30.0}
    assert published_figures(SETUP_FIGURES, ("roxford5k",)) == {}  # no Recall@k among them


@pytest.mark.slow
def test_eval_py_shows_the_published_map_per_setup(tmp_path: Path) -> None:
    """``eval.py model=<folder> benchmark=roxford5k`` of weights whose cfg publishes ROxf mAP: the mAP table gains
    ``published mAP`` and ``delta`` per setup (ours minus theirs, read back from results.json), easy shows '-'."""
    from hydra_helpers import compose_run_config
    from revisitop_files import write_revisitop
    from robustness.entry_helpers import run_entry

    import aggzoo
    from aggzoo.hub.builder import build_model
    from aggzoo.hub.cfg import PretrainedCfg
    from aggzoo.run.model_by_name import model_spec

    write_revisitop(tmp_path / "data" / "roxford5k")
    torch.manual_seed(0)
    model = build_model(model_spec(compose_run_config("eval", ["backbone=test_resnet"], tmp_path / "compose"))).eval()
    cfg = PretrainedCfg(architecture="gem_test_resnet", tag="published", input_size=(3, 48, 64), metrics=SETUP_FIGURES)
    saved = aggzoo.save_pretrained(model, tmp_path / "saved", pretrained_cfg=cfg)
    out = tmp_path / "run"
    result = run_entry([f"model={saved}", "benchmark=roxford5k", "evaluation.outputs.pictures=false",
                        f"hydra.run.dir={out}"], tmp_path, script="eval.py")
    assert result.returncode == 0, result.stderr[-3000:]
    recorded = json.loads((out / "results.json").read_text())["results"][0]
    assert recorded["published_metrics"] == {"medium/mAP": 60.0, "hard/mAP": 40.0, "hard/mP@10": 30.0}
    ours = recorded["metrics"]
    for key, theirs in recorded["published_metrics"].items():
        assert recorded["delta_metrics"][key] == pytest.approx(100 * ours[key] - theirs, abs=0.006)
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.startswith("benchmark") and "setup" in line).split()
    assert header[-3:] == ["published", "mAP", "delta"]
    rows = {line.split()[1]: line.split() for line in lines if line.startswith("roxford5k ")}
    assert rows["medium"][-2:] == ["60.00", f"{100 * ours['medium/mAP'] - 60.0:+.2f}"]
    assert rows["hard"][-2:] == ["40.00", f"{100 * ours['hard/mAP'] - 40.0:+.2f}"]
    assert rows["easy"][-2:] == ["-", "-"]
