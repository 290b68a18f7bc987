"""Tests of the synthetic city generator: formats, counts, geometry, determinism and caching.

File names are parsed here with a few lines of our own, independent of the project's loaders, so a
format slip in the generator cannot hide behind the same slip in a loader.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from aggzoo.data.synthetic import (
    COMPLETE_FILE,
    CONFIG_FILE,
    REFERENCE_CONDITION,
    SyntheticCityConfig,
    default_root,
    ensure_synthetic_city,
    generate,
)

TINY = SyntheticCityConfig(
    seed=3,
    num_cities=2,
    train_places=7,
    images_per_train_place=3,
    val_places=4,
    test_places=4,
    queries_per_place=2,
    places_per_street=3,
    image_size=(64, 48),
)
RADIUS_M = 25.0


@pytest.fixture(scope="module")
def city(tmp_path_factory) -> Path:
    return generate(tmp_path_factory.mktemp("city"), TINY, workers=1)


def _hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _parse_vg(path: Path) -> dict:
    parts = path.name.split("@")
    assert len(parts) == 16 and parts[0] == "" and parts[-1] == ".jpg", path.name
    east, north, zone, letter, lat, lon, pano, _tile, heading, *_rest, timestamp, note = parts[1:15]
    return {"east": float(east), "north": float(north), "zone": zone, "letter": letter, "lat": float(lat),
            "lon": float(lon), "pano": pano, "heading": float(heading), "timestamp": timestamp, "note": note}


def _vg(root: Path, split: str, part: str) -> list[dict]:
    return [_parse_vg(p) for p in sorted((root / "vg" / "images" / split / part).glob("*.jpg"))]


def _gsv_rows(root: Path) -> dict[str, list[dict]]:
    rows = {}
    for path in sorted((root / "gsv" / "Dataframes").glob("*.csv")):
        with open(path, newline="") as fh:
            reader = csv.DictReader(fh)
            assert reader.fieldnames == ["place_id", "year", "month", "northdeg", "city_id", "lat", "lon", "panoid"]
            rows[path.stem] = list(reader)
    return rows


def _metres(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    dy = (lat2 - lat1) * 111_320.0
    dx = (lon2 - lon1) * 111_320.0 * math.cos(math.radians(0.5 * (lat1 + lat2)))
    return math.hypot(dx, dy)


def test_gsv_names_match_csv_rows(city: Path) -> None:
    rows = _gsv_rows(city)
    assert len(rows) == TINY.num_cities
    for name, city_rows in rows.items():
        expected = set()
        for r in city_rows:
            assert r["city_id"] == name
            # The GSV-Cities loader rebuilds names with str(float) of the CSV values: they must round-trip.
            assert str(float(r["lat"])) == r["lat"] and str(float(r["lon"])) == r["lon"]
            assert "_" not in r["panoid"] and not r["panoid"].isdigit()
            expected.add(f"{name}_{int(r['place_id']):07d}_{int(r['year']):04d}_{int(r['month']):02d}_"
                         f"{int(r['northdeg']):03d}_{r['lat']}_{r['lon']}_{r['panoid']}.jpg")
        on_disk = {p.name for p in (city / "gsv" / "Images" / name).glob("*.jpg")}
        assert on_disk == expected and len(expected) == len(city_rows)


def test_gsv_counts(city: Path) -> None:
    rows = _gsv_rows(city)
    places = {name: sorted({int(r["place_id"]) for r in rs}) for name, rs in rows.items()}
    assert sum(len(p) for p in places.values()) == TINY.train_places
    for name, ids in places.items():
        assert ids == list(range(len(ids)))  # ids restart at 0 in every city
        per_place = [sum(int(r["place_id"]) == i for r in rows[name]) for i in ids]
        assert per_place == [TINY.images_per_train_place] * len(ids)


@pytest.mark.parametrize("split,n_places", [("val", TINY.val_places), ("test", TINY.test_places)])
def test_vg_names_and_counts(city: Path, split: str, n_places: int) -> None:
    db, queries = _vg(city, split, "database"), _vg(city, split, "queries")
    assert len(db) == n_places
    assert len(queries) == n_places * TINY.queries_per_place
    assert {d["note"] for d in db} == {REFERENCE_CONDITION}
    assert REFERENCE_CONDITION not in {q["note"] for q in queries}
    assert len({d["pano"] for d in db}) == n_places


def test_splits_are_disjoint(city: Path) -> None:
    coords = {"train": [(float(r["lat"]), float(r["lon"])) for rs in _gsv_rows(city).values() for r in rs]}
    for split in ("val", "test"):
        coords[split] = [(d["lat"], d["lon"]) for part in ("database", "queries") for d in _vg(city, split, part)]
    names = list(coords)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            closest = min(_metres(*p, *q) for p in coords[a] for q in coords[b])
            assert closest > 10 * RADIUS_M, (a, b, closest)


@pytest.mark.parametrize("split", ["val", "test"])
def test_positives_within_radius_and_neighbours_outside(city: Path, split: str) -> None:
    db, queries = _vg(city, split, "database"), _vg(city, split, "queries")
    db_xy = np.array([[d["east"], d["north"]] for d in db])
    for q in queries:
        dist = np.hypot(*(db_xy - [q["east"], q["north"]]).T)
        own = np.array([d["pano"] == q["pano"] for d in db])
        assert (dist[own] <= RADIUS_M).all() and own.sum() >= 1
        # Neighbouring places on the same street are negatives, and clearly so.
        assert (dist[~own] > RADIUS_M).all() and dist[~own].min() >= 35.0


def test_deterministic_and_independent_of_workers(city: Path, tmp_path: Path) -> None:
    again = generate(tmp_path / "again", TINY, workers=2)
    assert _hashes(again) == _hashes(city)


def test_different_seed_gives_different_images(city: Path, tmp_path: Path) -> None:
    other = generate(tmp_path / "other", SyntheticCityConfig(**{**TINY.to_dict(), "seed": 4}), workers=1)
    ours = {h for p, h in _hashes(city).items() if p.endswith(".jpg")}
    theirs = {h for p, h in _hashes(other).items() if p.endswith(".jpg")}
    assert not ours & theirs


def test_conditions_change_appearance(city: Path) -> None:
    """Every query differs clearly from its own place's reference image (honest, not a difficulty measure)."""
    folder = city / "vg" / "images" / "val"
    db = {_parse_vg(p)["pano"]: p for p in (folder / "database").glob("*.jpg")}
    for path in (folder / "queries").glob("*.jpg"):
        q = np.asarray(Image.open(path), np.float32)
        ref = np.asarray(Image.open(db[_parse_vg(path)["pano"]]), np.float32)
        assert q.shape == ref.shape == (TINY.image_size[1], TINY.image_size[0], 3)
        assert np.abs(q - ref).mean() > 10.0, path.name


def _age(paths: list[Path]) -> None:
    for p in paths:
        os.utime(p, ns=(1_000_000_000, 1_000_000_000))


def test_cache_reused_when_complete(tmp_path: Path) -> None:
    root = generate(tmp_path / "c", TINY, workers=1)
    files = [p for p in root.rglob("*") if p.is_file()]
    _age(files)
    assert ensure_synthetic_city(root, TINY) == root
    assert all(p.stat().st_mtime_ns == 1_000_000_000 for p in files)


def test_cache_regenerated_without_marker_or_with_other_config(tmp_path: Path) -> None:
    root = generate(tmp_path / "c", TINY, workers=1)
    (root / COMPLETE_FILE).unlink()
    image = next((root / "vg" / "images" / "test" / "database").glob("*.jpg"))
    _age([image])
    ensure_synthetic_city(root, TINY, workers=1)
    assert (root / COMPLETE_FILE).exists()
    assert image.stat().st_mtime_ns != 1_000_000_000

    other = SyntheticCityConfig(**{**TINY.to_dict(), "seed": 5, "val_places": 2})
    ensure_synthetic_city(root, other, workers=1)
    assert json.loads((root / CONFIG_FILE).read_text())["config"]["seed"] == 5
    assert len(list((root / "vg" / "images" / "val" / "database").glob("*.jpg"))) == 2


def test_default_root_uses_env_and_config(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AGGZOO_DATA", str(tmp_path))
    assert default_root(TINY).parent == tmp_path / "synthetic_city"
    assert default_root(TINY) != default_root(SyntheticCityConfig(**{**TINY.to_dict(), "seed": 9}))


def test_refuses_foreign_folder(tmp_path: Path) -> None:
    (tmp_path / "gsv").mkdir()
    with pytest.raises(FileExistsError, match="not written by"):
        generate(tmp_path, TINY, workers=1)


def test_invalid_config_has_clear_error() -> None:
    with pytest.raises(ValueError, match="queries_per_place"):
        SyntheticCityConfig(queries_per_place=0)


RACE = SyntheticCityConfig(**{**TINY.to_dict(), "train_places": 40})  # long enough for the second to start


def _ensure_in_subprocess(root: str, queue) -> None:
    try:
        ensure_synthetic_city(Path(root), RACE, workers=1)
        queue.put("ok")
    except (OSError, RuntimeError, ValueError) as exc:  # reported to the parent, which fails the test
        queue.put(repr(exc))


def test_concurrent_first_use_both_succeed_and_cache_is_complete(tmp_path: Path) -> None:
    """Issue 14 item 2: two processes on a fresh cache folder, the second started while the first is
    writing images. Without the lock the second emptied what the first was writing: one of them failed
    (FileNotFoundError / "Directory not empty") and the folder was left marked complete with images and
    the CSVs missing."""
    import multiprocessing
    import time

    from aggzoo.data.synthetic import _count, _expected_counts, _is_complete

    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    root = tmp_path / "cache" / RACE.digest()
    procs = [ctx.Process(target=_ensure_in_subprocess, args=(str(root), queue)) for _ in range(2)]
    procs[0].start()
    deadline = time.monotonic() + 120
    while sum(1 for _ in root.rglob("*.jpg")) < 10 and time.monotonic() < deadline:
        time.sleep(0.01)
    procs[1].start()
    for p in procs:
        p.join(timeout=300)
    assert sorted(queue.get(timeout=5) for _ in procs) == ["ok", "ok"]
    assert [p.exitcode for p in procs] == [0, 0]
    assert _count(root) == _expected_counts(RACE)
    assert _is_complete(root, RACE)
    assert len(list((root / "gsv" / "Dataframes").glob("*.csv"))) == RACE.num_cities


def test_marker_over_missing_files_is_not_trusted(tmp_path: Path) -> None:
    """A marker over a folder that lost files (the state an older racing run left) is regenerated."""
    root = generate(tmp_path / "c", TINY, workers=1)
    next((root / "gsv" / "Dataframes").glob("*.csv")).unlink()
    for image in list((root / "gsv" / "Images").rglob("*.jpg"))[:5]:
        image.unlink()
    assert (root / COMPLETE_FILE).exists()
    ensure_synthetic_city(root, TINY, workers=1)
    from aggzoo.data.synthetic import _count, _expected_counts

    assert _count(root) == _expected_counts(TINY)
    assert len(list((root / "gsv" / "Dataframes").glob("*.csv"))) == TINY.num_cities


def test_old_plain_marker_is_regenerated(tmp_path: Path) -> None:
    root = generate(tmp_path / "c", TINY, workers=1)
    (root / COMPLETE_FILE).write_text(TINY.digest() + "\n")  # the marker of aggzoo before the file counts
    image = next((root / "vg" / "images" / "test" / "database").glob("*.jpg"))
    _age([image])
    ensure_synthetic_city(root, TINY, workers=1)
    assert image.stat().st_mtime_ns != 1_000_000_000
    assert json.loads((root / COMPLETE_FILE).read_text())["digest"] == TINY.digest()
