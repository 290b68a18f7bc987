"""``python eval.py model=... database=<folder> queries=<folder>`` (no ground truth) as a user runs it.

With the query folder inside the database folder every query is a database file too and finds itself
at score 1, 0 m. By default that is said loudly (a ``warning:`` line, counts in ``predictions.json``, a
summary line that does not read as a success); ``self_matches=exclude`` searches each query without
its own file (issue 25, point 2). ``bad_images=skip`` skips an unreadable file there too (point 8);
the picture shows the ``top_k`` asked for (point 14)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from entry_helpers import run_entry
from hydra_helpers import compose_run_config
from PIL import Image

import aggzoo
from aggzoo.hub.builder import build_model
from aggzoo.hub.cfg import PretrainedCfg
from aggzoo.run.pipeline import model_spec

NUM_DB, NUM_Q = 6, 3


def _vg_name(north: float, note: str) -> str:
    return f"@450000.00@{north:.2f}@33@W@@@{note}@@@@@@@@.png"


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(saved model, database folder, query folder inside it): queries 200 m apart from every other image."""
    root = tmp_path_factory.mktemp("self_matches")
    torch.manual_seed(0)
    model = build_model(model_spec(compose_run_config("eval", ["backbone=test_resnet"], root / "compose"))).eval()
    saved = aggzoo.save_pretrained(model, root / "saved", pretrained_cfg=PretrainedCfg(
        architecture="gem_test_resnet", tag="tiny", input_size=(3, 64, 64)))
    database, queries = root / "db", root / "db" / "queries"
    queries.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(NUM_DB + NUM_Q):
        folder, note = (database, f"db{i}") if i < NUM_DB else (queries, f"q{i}")
        pixels = rng.integers(0, 256, size=(48, 64, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / _vg_name(7000000.0 + 200 * i, note))
    return saved, database, queries


def _run(folders, tmp_path: Path, *extra: str):
    saved, database, queries = folders
    result = run_entry([f"model={saved}", f"database={database}", f"queries={queries}", "top_k=4",
                        "evaluation.outputs.pictures=false", f"hydra.run.dir={tmp_path / 'out'}", *extra],
                       tmp_path, script="eval.py")
    assert result.returncode == 0, result.stderr[-3000:]
    return result, json.loads((tmp_path / "out" / "predictions.json").read_text())


def test_queries_inside_the_database_are_reported_loudly_by_default(folders, tmp_path: Path) -> None:
    result, document = _run(folders, tmp_path)
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [
        f"warning: {NUM_Q} of {NUM_Q} queries found their own image file among the database images ({NUM_Q} of "
        f"them at top-1): queries={folders[2]} and database={folders[1]} share {NUM_Q} files. The figures below "
        "count those self-matches; search each query without its own file with self_matches=exclude, or give a "
        "query folder outside the database folder"], result.stderr[-3000:]
    summary = document["summary"]
    assert summary["self_matches"] == "report" and summary["num_database"] == NUM_DB + NUM_Q
    assert summary["queries_in_database"] == summary["queries_that_found_their_own_file"] == NUM_Q
    assert summary["queries_whose_top1_is_their_own_file"] == NUM_Q and summary["top1_within_25m"] == 1.0
    for entry in document["predictions"]:  # the query's own file, at score 1 and 0 m
        assert entry["results"][0]["database"] == entry["query"]
        assert entry["results"][0]["distance_m"] == 0.0 and entry["results"][0]["score"] == pytest.approx(1, abs=1e-5)
    (line,) = [line for line in result.stdout.splitlines() if "within 25 m" in line]
    assert line.endswith(f"100.0 % within 25 m (counting {NUM_Q} queries that found their own file: not a "
                         "measure of the model)"), line


def test_self_matches_exclude_searches_each_query_without_its_own_file(folders, tmp_path: Path) -> None:
    reported = _run(folders, tmp_path / "report")[1]
    result, document = _run(folders, tmp_path / "exclude", "self_matches=exclude")
    assert not [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    summary = document["summary"]
    assert summary["self_matches"] == "exclude" and summary["queries_in_database"] == NUM_Q
    assert summary["queries_that_found_their_own_file"] == 0
    # Every other image lies 200 m or more from a query: none of the top-1 is within 25 m any more.
    assert summary["top1_within_25m"] == 0.0
    for mine, theirs in zip(document["predictions"], reported["predictions"]):
        found = [r["database"] for r in mine["results"]]
        assert mine["query"] not in found and len(found) == 4
        # The same ranking as with the query's own file in it, less that file.
        assert found[:3] == [r["database"] for r in theirs["results"] if r["database"] != mine["query"]][:3]
    assert "queries searched without their own file: self_matches=exclude" in result.stdout


def test_a_bad_self_matches_value_is_one_error_line(folders, tmp_path: Path) -> None:
    saved, database, queries = folders
    result = run_entry([f"model={saved}", f"database={database}", f"queries={queries}", "self_matches=drop"],
                       tmp_path, script="eval.py")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "self_matches" in line and "report" in line and "exclude" in line


def test_bad_images_skip_skips_an_unreadable_file_and_the_picture_shows_top_k(folders, tmp_path: Path) -> None:
    saved, database, _ = folders
    junk_db = tmp_path / "junk_db"
    junk_db.mkdir()
    for path in sorted(database.glob("*.png"))[:5]:
        (junk_db / path.name).symlink_to(path)
    (junk_db / "._photo.jpg").write_bytes(b"\x00\x05\x16\x07" + b"\x00" * 60)  # macOS AppleDouble, not a JPEG
    queries = sorted((database / "queries").glob("*.png"))
    args = [f"model={saved}", f"database={junk_db}", f"queries={database / 'queries'}", "top_k=4"]
    refused = run_entry([*args, f"hydra.run.dir={tmp_path / 'fail'}"], tmp_path, script="eval.py")
    assert refused.returncode == 2 and "._photo.jpg" in refused.stderr, refused.stderr[-3000:]

    skipped = run_entry([*args, "bad_images=skip", f"hydra.run.dir={tmp_path / 'skip'}"], tmp_path, script="eval.py")
    assert skipped.returncode == 0, skipped.stderr[-3000:]
    listed = tmp_path / "skip" / "bad_images.tsv"
    assert f"note: skipped 1 unreadable images (bad_images=skip); listed in {listed}" in skipped.stdout
    assert listed.read_text().startswith(f"{junk_db / '._photo.jpg'}\t")
    document = json.loads((tmp_path / "skip" / "predictions.json").read_text())
    assert document["summary"]["num_database"] == 5 and document["summary"]["num_queries"] == len(queries)
    assert all(len(entry["results"]) == 4 for entry in document["predictions"])

    # The picture: one column per result asked for (top_k), whatever evaluation.grid_k's default is.
    widths = {}
    for k in (2, 4):
        out = tmp_path / f"picture{k}"
        done = run_entry([*args[:-1], f"top_k={k}", "bad_images=skip", f"hydra.run.dir={out}"], tmp_path,
                         script="eval.py")
        assert done.returncode == 0, done.stderr[-3000:]
        with Image.open(out / "predictions.png") as picture:
            widths[k] = picture.width
    # query + k thumbnails per row: 4 results take 5 cells, 2 take 3.
    assert widths[4] / widths[2] == pytest.approx(5 / 3, rel=0.08), widths
