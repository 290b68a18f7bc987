"""evaluate_benchmarks end to end on a VG folder written here: report files, pictures, submission."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from aggzoo.data.vg import load_vg
from aggzoo.evaluation.benchmarks import evaluate_benchmarks
from aggzoo.evaluation.options import EvaluationOptions, ExtractionOptions, OutputOptions, RerankOptions
from aggzoo.evaluation.report import grid_rows_caption, pick_queries, plot_recall_curves, plot_retrievals
from aggzoo.evaluation.result import result_from_predictions
from aggzoo.evaluation.submission import read_msls_submission, write_msls_submission
from aggzoo.run.benchmark_config import load_benchmark


class MeanColour(nn.Module):
    out_dim = 3

    def __init__(self) -> None:
        super().__init__()
        self.anchor = nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.normalize(x.mean(dim=(2, 3)) + 0.1 + self.anchor, dim=1)


def to_tensor(image: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(image.transpose(2, 0, 1).astype(np.float32) / 255.0)


@pytest.fixture
def vg_colours(tmp_path: Path) -> Path:
    """A VG folder: database colours on a line 100 m apart; each query a near colour at the same place."""
    rng = np.random.default_rng(0)
    root = tmp_path / "colours"
    colours = rng.integers(0, 256, size=(24, 3))
    for i, colour in enumerate(colours):
        out = root / "images/test/database"
        out.mkdir(parents=True, exist_ok=True)
        name = f"@{1000 + 100 * i}.00@5000.00@@@@@{i:03d}@.png"
        Image.new("RGB", (16, 12), tuple(int(c) for c in colour)).save(out / name)
    for i in range(10):
        out = root / "images/test/queries"
        out.mkdir(parents=True, exist_ok=True)
        noisy = np.clip(colours[i] + rng.integers(-20, 21, size=3), 0, 255)
        name = f"@{1000 + 100 * i + 5}.00@5000.00@@@@@q{i:03d}@.png"
        Image.new("RGB", (16, 12), tuple(int(c) for c in noisy)).save(out / name)
    return root


def test_evaluate_benchmarks_writes_the_report(vg_colours, tmp_path):
    node = {"_target_": "aggzoo.data.vg.load_vg", "root": str(vg_colours), "split": "test", "name": "colours"}
    out = tmp_path / "report"
    options = EvaluationOptions(ks=(1, 5), extraction=ExtractionOptions(batch_size=4),
                                rerank=RerankOptions(method={"top_m": 10, "k": 2}),
                                outputs=OutputOptions(dir=out, save_predictions=True, write_submissions=True))
    results = evaluate_benchmarks(MeanColour(), {"colours": load_benchmark(node)}, to_tensor, options,
                                  meta={"ckpt": "none"})
    (result,) = results
    assert result.num_queries == 10 and result.num_database == 24 and result.predictions.shape == (10, 10)
    data = json.loads((out / "results.json").read_text())
    assert data["meta"]["ckpt"] == "none" and data["meta"]["settings"]["rerank"]["top_m"] == 10
    assert data["results"][0]["recalls"] == {str(k): v for k, v in result.recalls.items()}
    assert "| colours | 10 | 24 |" in (out / "results.md").read_text()
    np.testing.assert_array_equal(np.load(out / "predictions_colours.npy"), result.predictions)
    submission = read_msls_submission(out / "submission_colours.txt")
    assert len(submission) == 10 and all(len(v) == 10 for v in submission.values())
    for png in ("recall_curves.png", "retrievals_colours.png"):
        image = np.asarray(Image.open(out / png))
        assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 300
        assert image[..., :3].std() > 10          # not a blank canvas


def test_grid_marks_correct_and_wrong(vg_colours, tmp_path):
    rs = load_vg(vg_colours)
    predictions = np.tile(np.arange(24), (10, 1))  # query i's positive is database i
    result = result_from_predictions(rs, predictions, ks=(1, 5))
    assert result.recalls[1] == pytest.approx(0.1)  # only query 0 at rank 1
    path = plot_retrievals(result, tmp_path / "grid.png", queries=[0, 7], k=3)
    pixels = np.asarray(Image.open(path).convert("RGB")).reshape(-1, 3).astype(int)
    green = ((pixels[:, 1] > 120) & (pixels[:, 0] < 90) & (pixels[:, 2] < 90)).sum()
    red = ((pixels[:, 0] > 180) & (pixels[:, 1] < 80) & (pixels[:, 2] < 80)).sum()
    assert green > 500 and red > 500                # frames of both kinds were drawn
    plot_recall_curves([result], tmp_path / "curve.png")
    assert (tmp_path / "curve.png").stat().st_size > 5000


def test_grid_title_says_its_rows_were_chosen_to_show_failures(vg_colours):
    """pick_queries draws about half failures: the title must not let the grid pass for a sample."""
    rs = load_vg(vg_colours)
    result = result_from_predictions(rs, np.tile(np.arange(24), (10, 1)), ks=(1, 5))  # only query 0 right
    rows = pick_queries(result, 4)
    assert rows[0] == 0 and len(rows) == 4  # the one success, then failures
    caption = grid_rows_caption(result, rows, picked=True)
    assert caption == "rows chosen to show failures, not a random sample: 1 right at rank 1, 3 wrong (R@1 over all 10 queries: 10.00 %)"
    assert grid_rows_caption(result, [0, 7], picked=False) == "rows: the 2 queries asked for (1 right at rank 1, 1 wrong)"


@pytest.mark.filterwarnings("ignore:Input line 1 contained no data")  # our comment line, as in upstream's example
def test_submission_round_trip(vg_colours, tmp_path):
    rs = load_vg(vg_colours)
    predictions = np.stack([np.roll(np.arange(24), -i) for i in range(10)])
    got = read_msls_submission(write_msls_submission(rs, predictions, tmp_path / "s.txt", k=4))
    first_query = rs.query_paths[0].stem
    assert got[first_query] == [rs.database_paths[j].stem for j in predictions[0, :4]]
    # the format the official evaluate.py parses: np.loadtxt(dtype=str) with comments skipped
    table = np.loadtxt(tmp_path / "s.txt", dtype=str, ndmin=2)
    assert table.shape == (10, 5) and table[0, 0] == first_query


def test_load_benchmark_passes_sets_through(vg_colours):
    rs = load_vg(vg_colours)
    assert load_benchmark(rs) is rs


def test_vpr_bench_folder_end_to_end_matches_brute_force(tmp_path):
    """The acceptance check for the VPR-Bench layout: evaluate a folder written in that layout and
    compare Recall@k with a brute force on the same (saved) descriptors."""
    rng = np.random.default_rng(1)
    root = tmp_path / "GardensPoint"
    colours = rng.integers(0, 256, size=(30, 3))
    for i, colour in enumerate(colours):
        (root / "ref").mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8, 8), tuple(int(c) for c in colour)).save(root / "ref" / f"{i}.jpg", quality=95)
    rows = np.empty((12, 2), dtype=object)
    for i in range(12):
        (root / "query").mkdir(exist_ok=True)
        noisy = np.clip(colours[i] + rng.integers(-40, 41, size=3), 0, 255)
        Image.new("RGB", (8, 8), tuple(int(c) for c in noisy)).save(root / "query" / f"{i}.jpg", quality=95)
        rows[i] = [i, [i, (i + 1) % 30]]   # the same frame or the next one
    np.save(root / "ground_truth_new.npy", rows, allow_pickle=True)

    node = {"_target_": "aggzoo.data.vpr_bench.load_vpr_bench", "root": str(root)}
    options = EvaluationOptions(ks=(1, 5, 10),
                                outputs=OutputOptions(dir=tmp_path / "out", save_descriptors=True, pictures=False))
    (result,) = evaluate_benchmarks(MeanColour(), {"gp": load_benchmark(node)}, to_tensor, options)
    saved = np.load(tmp_path / "out" / "descriptors_gp.npz")
    order = np.argsort(-(saved["queries"].astype(np.float64) @ saved["database"].astype(np.float64).T), axis=1,
                       kind="stable")
    for k in (1, 5, 10):
        expected = np.mean([bool({i, (i + 1) % 30} & set(order[i, :k])) for i in range(12)])
        assert result.recalls[k] == pytest.approx(expected)
