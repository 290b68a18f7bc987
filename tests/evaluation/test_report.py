"""Report files are created, readable, and say what the results say."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from aggzoo.evaluation.report import format_table, write_json, write_markdown
from aggzoo.evaluation.result import RetrievalResult


def make_result(name: str, recalls: dict[int, float], without: int = 0) -> RetrievalResult:
    return RetrievalResult(
        name=name, recalls=recalls, num_queries=740, num_database=18871, queries_without_positive=without,
        predictions=np.zeros((740, 20), np.int64), curve=np.linspace(0.5, 0.9, 20), descriptor_dim=512,
    )


RESULTS = [make_result("msls_val", {1: 0.9216, 5: 0.96, 10: 0.97, 20: 0.975}),
           make_result("pitts30k_test", {1: 0.5, 5: 0.75, 10: 0.8, 20: 0.8125}, without=3)]


def test_table_in_percent():
    table = format_table(RESULTS)
    lines = table.splitlines()
    # the header says the unit (issue 14 item 10); columns are two or more spaces apart
    assert re.split(r"\s{2,}", lines[0]) == ["benchmark", "queries", "database", "R@1 (%)", "R@5 (%)", "R@10 (%)", "R@20 (%)"]
    assert lines[2].split() == ["msls_val", "740", "18871", "92.16", "96.00", "97.00", "97.50"]
    assert lines[3].split()[-1] == "81.25"


def test_json_round_trip(tmp_path):
    path = write_json(RESULTS, tmp_path / "out" / "results.json", meta={"ckpt": "x.ckpt"})
    data = json.loads(path.read_text())
    assert data["meta"] == {"ckpt": "x.ckpt"}
    assert [r["name"] for r in data["results"]] == ["msls_val", "pitts30k_test"]
    assert data["results"][0]["recalls"] == {"1": 0.9216, "5": 0.96, "10": 0.97, "20": 0.975}
    assert data["results"][1]["queries_without_positive"] == 3
    assert len(data["results"][0]["curve"]) == 20


def test_json_labels_tell_apart_results_of_one_benchmark(tmp_path):
    """The train job's test_results.json: pooling baseline, untrained and trained rows of one benchmark,
    labelled with the keys run_summary.json uses (issue 14 item 6)."""
    same = [make_result("synthetic_test", {1: r}) for r in (0.1, 0.2, 0.3)]
    labels = ["pooling_baseline", "untrained", "trained"]
    data = json.loads(write_json(same, tmp_path / "t.json", labels=labels).read_text())
    assert [(r["label"], r["name"]) for r in data["results"]] == [(label, "synthetic_test") for label in labels]
    assert "label" not in json.loads(write_json(same, tmp_path / "u.json").read_text())["results"][0]
    with pytest.raises(ValueError, match="2 labels for 3 results"):
        write_json(same, tmp_path / "v.json", labels=labels[:2])


def test_markdown(tmp_path):
    text = write_markdown(RESULTS, tmp_path / "results.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("|")]
    assert rows[0] == "| benchmark | queries | database | R@1 (%) | R@5 (%) | R@10 (%) | R@20 (%) |"
    assert rows[2] == "| msls_val | 740 | 18871 | 92.16 | 96.00 | 97.00 | 97.50 |"
    assert "3 of 740 queries have no positive" in text


def test_query_labels_are_file_names_shortened_in_the_middle() -> None:
    from aggzoo.evaluation.report import query_label

    assert query_label("/data/q/frame_0007.jpg") == "frame_0007.jpg"
    long = "@450000.00@7000600.00@33@W@@@q3@@@@@@@@.png"
    label = query_label(f"/data/{long}")
    assert len(label) == 28 and label.startswith(long[:12]) and label.endswith(long[-13:]) and "..." in label
