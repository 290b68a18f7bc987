"""VG layout loader: files written here in the exact layout, positives checked against brute force."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from aggzoo.data.layout import positives_within_radius
from aggzoo.data.vg import load_vg, utm_from_name
from aggzoo.errors import DatasetFormatError, DatasetLayoutError


def vg_name(east: float, north: float, extra: str = "") -> str:
    return f"@{east:.2f}@{north:.2f}@17@T@40.4@-79.9@pano{extra}@@@@@@@@.jpg"


def write_vg(root: Path, split: str, db_xy: np.ndarray, q_xy: np.ndarray) -> None:
    for folder, points in (("database", db_xy), ("queries", q_xy)):
        out = root / "images" / split / folder
        out.mkdir(parents=True, exist_ok=True)
        for i, (e, n) in enumerate(points):
            Image.new("RGB", (8, 6), (i % 255, 0, 0)).save(out / vg_name(e, n, f"{i:04d}"))


@pytest.fixture
def vg_root(tmp_path: Path) -> tuple[Path, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    db = np.round(rng.uniform(0, 300, size=(40, 2)) + [550000, 4470000], 2)
    q = np.round(rng.uniform(0, 300, size=(15, 2)) + [550000, 4470000], 2)
    q[0] = db[3] + [25.0, 0.0]       # exactly on the radius: counts (distance <= 25 m)
    q[1] = db[4] + [25.01, 0.0]      # just outside, and far from the rest
    q[2] = [560000, 4480000]         # nobody within 25 m
    write_vg(tmp_path / "pitts", "test", db, q)
    return tmp_path / "pitts", db, q


def test_positives_match_brute_force(vg_root):
    root, db, q = vg_root
    rs = load_vg(root, split="test")
    assert rs.name == "pitts_test" and rs.num_database == 40 and rs.num_queries == 15
    # File order is sorted by name; map back to the written coordinates through the names.
    db_xy = np.array([utm_from_name(p) for p in rs.database_paths])
    q_xy = np.array([utm_from_name(p) for p in rs.query_paths])
    dist = np.linalg.norm(q_xy[:, None, :] - db_xy[None, :, :], axis=-1)
    for i, pos in enumerate(rs.positives):
        assert pos.dtype == np.int64
        np.testing.assert_array_equal(pos, np.flatnonzero(dist[i] <= 25.0 + 1e-9))
    by_query = {tuple(np.round(xy, 2)): pos for xy, pos in zip(q_xy, rs.positives)}
    assert len(by_query[tuple(q[2])]) == 0
    assert rs.queries_without_positive >= 1
    on_radius = by_query[tuple(q[0])]
    assert any(np.allclose(db_xy[j], db[3]) for j in on_radius)
    assert not any(np.allclose(db_xy[j], db[4]) for j in by_query[tuple(q[1])])


def test_radius_and_name_arguments(vg_root):
    root, _, _ = vg_root
    small = load_vg(root, positive_radius_m=1.0, name="mine")
    large = load_vg(root, positive_radius_m=100.0)
    assert small.name == "mine"
    assert sum(map(len, small.positives)) < sum(map(len, large.positives))
    for s, l in zip(small.positives, large.positives):
        assert set(s) <= set(l)


def test_images_listed_recursively_and_sorted(tmp_path):
    write_vg(tmp_path / "d", "val", np.array([[40.0, 40.0], [0.0, 0.0]]), np.array([[0.0, 1.0]]))
    sub = tmp_path / "d/images/val/database/sub"
    sub.mkdir()
    Image.new("RGB", (4, 4)).save(sub / vg_name(5.0, 5.0))
    rs = load_vg(tmp_path / "d", split="val")
    assert rs.num_database == 3
    assert list(rs.database_paths) == sorted(rs.database_paths)
    # queries at (0,1): positives are (0,0) and (5,5) but not (40,40)
    got = {utm_from_name(rs.database_paths[j]) for j in rs.positives[0]}
    assert got == {(0.0, 0.0), (5.0, 5.0)}


def test_missing_split_names_layout_and_source(vg_root):
    root, _, _ = vg_root
    with pytest.raises(DatasetLayoutError) as err:
        load_vg(root, split="val")
    message = str(err.value)
    assert "images/<split>/database" in message and "VPR-datasets-downloader" in message
    assert "'test'" in message  # what was found instead
    assert isinstance(err.value, FileNotFoundError)
    with pytest.raises(DatasetLayoutError, match="dataset root"):
        load_vg(root / "nope")


def test_malformed_name_is_named(vg_root):
    root, _, _ = vg_root
    bad = root / "images/test/queries/holiday.jpg"
    Image.new("RGB", (4, 4)).save(bad)
    with pytest.raises(DatasetFormatError, match="holiday.jpg"):
        load_vg(root)


def test_empty_folder(tmp_path):
    (tmp_path / "x/images/test/database").mkdir(parents=True)
    (tmp_path / "x/images/test/queries").mkdir(parents=True)
    with pytest.raises(DatasetLayoutError, match="no images"):
        load_vg(tmp_path / "x")


def test_positives_within_radius_empty_database():
    pos = positives_within_radius(np.zeros((0, 2)), np.zeros((3, 2)), 25.0)
    assert len(pos) == 3 and all(p.size == 0 for p in pos)
