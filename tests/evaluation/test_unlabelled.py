"""``eval.py model=... database=<folder> queries=<folder>``: retrieval without ground truth, through the
real eval config and ``run.pipeline.evaluate``.

Independent expectations: a query that is a pixel copy of a database image retrieves it first with
cosine 1; distances equal the closed-form distance of the coordinates written into the file names
(UTM: Euclidean; latitude/longitude: great circle); on real nordland_mini frames, the share of top-1
results within 25 m equals the share whose top-1 is the query's own frame (read from the names).
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra_helpers import compose_run_config
from PIL import Image

import aggzoo
from aggzoo.data.folder import EARTH_RADIUS_M
from aggzoo.errors import ConfigError, UserError
from aggzoo.evaluation.protocol import protocol_transform
from aggzoo.evaluation.unlabelled import coordinates_from_names, predict
from aggzoo.hub.builder import build_model
from aggzoo.hub.cfg import PretrainedCfg
from aggzoo.run.evaluate import evaluate
from aggzoo.run.model_by_name import model_spec


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    """A random test_resnet + GeM, saved with a protocol of 64 x 64."""
    root = tmp_path_factory.mktemp("unlabelled_model")
    torch.manual_seed(0)
    model = build_model(model_spec(compose_run_config("eval", ["backbone=test_resnet"], root / "compose"))).eval()
    cfg = PretrainedCfg(architecture="gem_test_resnet", tag="tiny", input_size=(3, 64, 64))
    return model, aggzoo.save_pretrained(model, root / "saved", pretrained_cfg=cfg)


def _noise(path: Path, seed: int) -> np.ndarray:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(48, 64, 3), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)  # PNG: lossless, so a copy is the same pixels
    return pixels


def _vg_name(east: float, north: float, note: str) -> str:
    return f"@{east:.2f}@{north:.2f}@33@W@@@{note}@@@@@@@@.png"


def test_generated_folders_write_predictions_distances_and_the_grid(tiny_model, tmp_path: Path) -> None:
    model, saved = tiny_model
    database, queries = tmp_path / "db", tmp_path / "q" / "nested"  # sub-folders are searched too
    for i in range(6):
        _noise(database / _vg_name(450000.0, 7000000.0 + 100 * i, f"db{i}"), seed=i)
    copies = {0: 1, 1: 3, 2: 4}  # query j is a pixel copy of database image copies[j], 5 m away (3-4-5)
    queries.mkdir(parents=True)
    for j, i in copies.items():
        source = database / _vg_name(450000.0, 7000000.0 + 100 * i, f"db{i}")
        Image.open(source).save(queries / _vg_name(450003.0, 7000004.0 + 100 * i, f"q{j}"))
    out = tmp_path / "out"
    cfg = compose_run_config("eval", [f"model={saved}", f"database={database}", f"queries={tmp_path / 'q'}",
                                      "top_k=4", "evaluation.outputs.grid_queries=3",
                                      "evaluation.outputs.grid_k=3"], out)
    assert evaluate(cfg) == []
    with (out / "predictions.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 3 * 4 and [int(r["rank"]) for r in rows[:4]] == [1, 2, 3, 4]
    document = json.loads((out / "predictions.json").read_text())
    query_names = sorted(p.name for p in queries.iterdir())  # the order eval.py lists them in
    for entry in document["predictions"]:
        j = int(Path(entry["query"]).name.split("@")[7][1:])
        first = entry["results"][0]
        assert Path(first["database"]).name == _vg_name(450000.0, 7000000.0 + 100 * copies[j], f"db{copies[j]}")
        assert first["score"] == pytest.approx(1.0, abs=1e-5)
        assert first["distance_m"] == pytest.approx(5.0, abs=1e-6)
        for result in entry["results"][1:]:
            assert result["score"] <= first["score"] + 1e-6
            east, north = (float(v) for v in Path(result["database"]).name.split("@")[1:3])
            q_east, q_north = (float(v) for v in Path(entry["query"]).name.split("@")[1:3])
            assert result["distance_m"] == pytest.approx(math.hypot(east - q_east, north - q_north), abs=0.01)
    assert [Path(e["query"]).name for e in document["predictions"]] == query_names
    assert document["summary"]["coordinates"] == "utm" and document["summary"]["top1_within_25m"] == 1.0
    assert document["meta"]["model"] == str(saved) and document["meta"]["protocol"]["image_size"] == [64, 64]
    with Image.open(out / "predictions.png") as picture:
        assert picture.width > 300 and picture.height > 200  # 3 rows of query + top-3


def test_latitude_longitude_names_give_great_circle_metres_and_plain_names_none(tiny_model, tmp_path: Path) -> None:
    """GSV-Cities names (``..._<lat>_<lon>_<panoid>.jpg``): metres on the sphere; names without
    coordinates: no distances at all (rather than made-up ones)."""
    model = tiny_model[0]
    lat, lon = 45.0, 7.0
    db = [tmp_path / f"Turin_0000001_2019_05_000_{lat}_{lon}_pano{i}.png" for i in range(2)]
    _noise(db[0], 0), _noise(db[1], 1)
    query = tmp_path / "q" / f"Turin_0000002_2020_05_000_{lat + 0.001}_{lon}_panoq.png"
    _noise(query, 0)
    assert coordinates_from_names(db)[0] == "latlon"
    transform = protocol_transform((64, 64), multiple=16)
    found = predict(model, db, [query], transform, k=2)
    assert found.coordinates == "latlon" and found.indices[0, 0] == 0
    metres = EARTH_RADIUS_M * math.radians(0.001)  # a meridian arc
    np.testing.assert_allclose(found.distances_m[0], [metres, metres], rtol=1e-6)
    plain = [tmp_path / "plain" / f"frame{i}.png" for i in range(2)]
    _noise(plain[0], 3), _noise(plain[1], 4)
    assert coordinates_from_names(plain) is None
    assert predict(model, plain, [query], transform, k=1).distances_m is None


@pytest.mark.parametrize(("given", "expected"), [
    (lambda t: ["database=" + str(t / "missing"), "queries=" + str(t)], "database=.*no such folder"),
    (lambda t: ["database=" + str(t / "empty"), "queries=" + str(t)], "database=.*holds no image files"),
    (lambda t: ["queries=" + str(t / "empty")], "database= is not set"),
    (lambda t: ["database=" + str(t), "queries=" + str(t), "benchmark=synthetic_test"], "two evaluations"),
], ids=["missing", "empty", "unset", "and_a_benchmark"])
def test_missing_or_empty_folders_name_the_layout(tiny_model, tmp_path: Path, given, expected) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("not an image")
    cfg = compose_run_config("eval", [f"model={tiny_model[1]}", *given(tmp_path)], tmp_path / "out")
    with pytest.raises(UserError, match=expected) as info:
        evaluate(cfg)
    assert isinstance(info.value, ConfigError) or "Expected database=<folder> and queries=<folder>" in str(info.value)


def test_nordland_mini_frames_without_ground_truth(nordland_mini: Path, tmp_path: Path) -> None:
    """Real images: 12 consecutive winter frames against the same 12 summer frames, linked into plain
    folders (no ground truth), with the shipped nordland_mini weights by name."""
    split = nordland_mini / "vg" / "images" / "test"
    database, queries = tmp_path / "summer", tmp_path / "winter"
    for source, target in ((split / "database", database), (split / "queries", queries)):
        target.mkdir()
        for path in sorted(source.iterdir())[600:612]:
            (target / path.name).symlink_to(path)
    out = tmp_path / "out"
    evaluate(compose_run_config("eval", ["model=netvlad_efficientnet_lite0.nordland_mini", f"database={database}",
                                         f"queries={queries}", "top_k=3", "evaluation.outputs.grid_queries=4"], out))
    document = json.loads((out / "predictions.json").read_text())
    assert document["meta"]["protocol"]["image_size"] == [64, 128]  # the weights' own protocol
    same_frame = []
    for entry in document["predictions"]:
        q_north = float(Path(entry["query"]).name.split("@")[2])
        for result in entry["results"]:
            db_north = float(Path(result["database"]).name.split("@")[2])
            assert result["distance_m"] == pytest.approx(abs(db_north - q_north), abs=0.01)  # fake UTM: 200 m a frame
        same_frame.append(entry["results"][0]["distance_m"] == 0.0)
    assert document["summary"]["top1_within_25m"] == pytest.approx(np.mean(same_frame), abs=5e-5)  # 4 decimals
    assert (out / "predictions.png").is_file() and (out / "predictions.csv").is_file()
