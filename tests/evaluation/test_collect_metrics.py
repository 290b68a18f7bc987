"""``python -m aggzoo.run.collect_runs`` over eval.py runs of a benchmark scored by mAP: the sweep table shows the
mAP of each setup beside Recall@k (issue 21: reports show whichever metrics the benchmark has)."""

from __future__ import annotations

import json
from pathlib import Path

from aggzoo.run.collect_runs import collect_runs, format_runs


def _eval_run(folder: Path, maps: dict[str, float], benchmark: str = "roxford5k", metric: str = "mAP") -> None:
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text(f"- benchmark={benchmark}\n")
    (folder / ".hydra" / "config.yaml").write_text("task_name: eval\n")
    metrics = {f"{setup}/{metric}": value for setup, value in maps.items()}
    result = {"name": benchmark, "recalls": {"1": 0.5, "5": 0.75, "10": 1.0}, "metrics": metrics}
    (folder / "results.json").write_text(json.dumps({"meta": {}, "results": [result]}))


def test_the_sweep_table_shows_each_setups_map(tmp_path: Path) -> None:
    _eval_run(tmp_path / "0", {"easy": 0.8, "medium": 0.6, "hard": 0.3})
    _eval_run(tmp_path / "1", {"easy": 0.9, "medium": 0.7, "hard": 0.4})
    table = format_runs(collect_runs(tmp_path), fmt="csv").splitlines()
    header = table[0].split(",")
    columns = [h for h in header if h.endswith("mAP (%)")]
    assert columns == ["roxford5k easy/mAP (%)", "roxford5k medium/mAP (%)", "roxford5k hard/mAP (%)"]
    rows = {line.split(",")[0]: dict(zip(header, line.split(","))) for line in table[1:]}
    assert float(rows["1"]["roxford5k hard/mAP (%)"]) == 40.0
    assert float(rows["0"]["roxford5k medium/mAP (%)"]) == 60.0


def test_the_sweep_table_shows_map_at_r_of_a_metric_learning_benchmark(tmp_path: Path) -> None:
    _eval_run(tmp_path / "0", {"all": 0.25}, benchmark="cub200", metric="MAP@R")
    _eval_run(tmp_path / "1", {"all": 0.5}, benchmark="cub200", metric="MAP@R")
    table = format_runs(collect_runs(tmp_path), fmt="csv").splitlines()
    header = table[0].split(",")
    assert [h for h in header if "MAP@R" in h] == ["cub200 all/MAP@R (%)"]
    rows = {line.split(",")[0]: dict(zip(header, line.split(","))) for line in table[1:]}
    assert float(rows["0"]["cub200 all/MAP@R (%)"]) == 25.0 and float(rows["1"]["cub200 all/MAP@R (%)"]) == 50.0
