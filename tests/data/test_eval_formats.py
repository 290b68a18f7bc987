"""npy lists, VPR-Bench, MSLS and folder+CSV loaders against files written here in the exact layouts."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from aggzoo.data.folder import EARTH_RADIUS_M, load_folder
from aggzoo.data.msls import load_msls
from aggzoo.data.npy_lists import load_npy_lists
from aggzoo.data.vpr_bench import load_vpr_bench
from aggzoo.errors import DatasetFormatError, DatasetLayoutError


def touch_image(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (4, 4)).save(path)
    return path


def object_rows(rows) -> np.ndarray:
    out = np.empty(len(rows), dtype=object)
    for i, r in enumerate(rows):
        out[i] = np.asarray(r, dtype=np.int64)
    return out


# ------------------------------------------------------------------------------------------ npy lists


def write_npy_lists(tmp_path: Path, prefix: str, n_db: int, n_q: int):
    images, lists = tmp_path / "images", tmp_path / "lists"
    lists.mkdir(parents=True)
    db = np.array([f"database/{i:05d}.jpg" for i in range(n_db)])   # numpy unicode, as gsv-cities saves them
    q = np.array([f"queries/{i:05d}.jpg" for i in range(n_q)])
    for rel in [*db, *q]:
        touch_image(images / rel)
    np.save(lists / f"{prefix}_dbImages.npy", db)
    np.save(lists / f"{prefix}_qImages.npy", q)
    return images, lists, db, q


def test_npy_lists_pitts_style(tmp_path):
    images, lists, db, q = write_npy_lists(tmp_path, "pitts30k_test", 6, 3)
    np.save(lists / "pitts30k_test_gt.npy", object_rows([[0, 2], [], [5, 1, 1]]), allow_pickle=True)
    rs = load_npy_lists(images, prefix="pitts30k_test", lists_dir=lists)
    assert rs.name == "pitts30k_test" and rs.num_database == 6 and rs.num_queries == 3
    assert rs.database_paths[4] == images / db[4] and rs.query_paths[2] == images / q[2]
    assert [p.tolist() for p in rs.positives] == [[0, 2], [], [1, 5]]   # sorted, unique
    assert all(p.dtype == np.int64 for p in rs.positives)
    assert rs.queries_without_positive == 1


def test_npy_lists_msls_val_keeps_query_subset(tmp_path):
    images, lists, db, q = write_npy_lists(tmp_path, "msls_val", 5, 6)
    kept = np.array([0, 2, 3, 5])
    np.save(lists / "msls_val_qIdx.npy", kept)
    np.save(lists / "msls_val_pIdx.npy", object_rows([[1], [0, 4], [2], [3]]), allow_pickle=True)
    rs = load_npy_lists(images, prefix="msls_val", lists_dir=lists, query_index_file="msls_val_qIdx.npy",
                        positives_file="msls_val_pIdx.npy")
    assert rs.num_queries == 4
    assert [p.name for p in rs.query_paths] == [Path(q[i]).name for i in kept]
    assert [p.tolist() for p in rs.positives] == [[1], [0, 4], [2], [3]]


def test_npy_lists_errors(tmp_path):
    images, lists, _, _ = write_npy_lists(tmp_path, "x", 3, 2)
    with pytest.raises(DatasetLayoutError, match="x_gt.npy") as err:
        load_npy_lists(images, prefix="x", lists_dir=lists)
    assert "gsv-cities" in str(err.value)
    np.save(lists / "x_gt.npy", object_rows([[0], [3]]), allow_pickle=True)
    with pytest.raises(DatasetFormatError, match="outside"):
        load_npy_lists(images, prefix="x", lists_dir=lists)
    np.save(lists / "x_gt.npy", object_rows([[0]]), allow_pickle=True)
    with pytest.raises(DatasetFormatError, match="1 ground-truth rows for 2 queries"):
        load_npy_lists(images, prefix="x", lists_dir=lists)
    np.save(lists / "x_gt.npy", object_rows([[0], [1]]), allow_pickle=True)
    with pytest.raises(DatasetLayoutError, match="first database image"):
        load_npy_lists(tmp_path / "elsewhere", prefix="x", lists_dir=lists)


# ------------------------------------------------------------------------------------------ VPR-Bench


def test_vpr_bench_numeric_order_and_ground_truth(tmp_path):
    root = tmp_path / "SPEDTEST"
    for i in (0, 1, 2, 10, 11):           # 10.jpg must come after 2.jpg
        touch_image(root / "ref" / f"{i}.jpg")
    for i in (0, 1, 2):
        touch_image(root / "query" / f"{i:07d}.jpg")
    rows = np.empty((2, 2), dtype=object)    # query 1 is absent from the ground truth
    rows[0] = [2, [4, 3]]
    rows[1] = [0, [0]]
    np.save(root / "ground_truth_new.npy", rows, allow_pickle=True)
    rs = load_vpr_bench(root)
    assert rs.name == "SPEDTEST"
    assert [p.name for p in rs.database_paths] == ["0.jpg", "1.jpg", "2.jpg", "10.jpg", "11.jpg"]
    assert [p.tolist() for p in rs.positives] == [[0], [], [3, 4]]


def test_vpr_bench_errors(tmp_path):
    with pytest.raises(DatasetLayoutError, match="ground_truth_new.npy") as err:
        load_vpr_bench(tmp_path / "Nordland")
    assert "VPR-Bench" in str(err.value)
    root = tmp_path / "d"
    touch_image(root / "ref" / "a.jpg")
    touch_image(root / "query" / "0.jpg")
    np.save(root / "ground_truth_new.npy", np.empty((0, 2), dtype=object), allow_pickle=True)
    with pytest.raises(DatasetFormatError, match="a.jpg"):
        load_vpr_bench(root)


# ------------------------------------------------------------------------------------------------ MSLS


def write_csv(path: Path, header: list[str], rows: list[list]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)


def write_msls_side(folder: Path, keys, utm, pano, subtask_all):
    write_csv(folder / "seq_info.csv", ["", "key", "sequence_key", "frame_number"],
              [[i, k, "s0", i] for i, k in enumerate(keys)])
    write_csv(folder / "postprocessed.csv", ["", "key", "easting", "northing", "night", "view_direction"],
              [[i, k, e, n, False, "Forward"] for i, (k, (e, n)) in enumerate(zip(keys, utm))])
    write_csv(folder / "raw.csv", ["", "key", "lon", "lat", "ca", "captured_at", "pano"],
              [[i, k, 0, 0, 0, 0, p] for i, (k, p) in enumerate(zip(keys, pano))])
    write_csv(folder / "subtask_index.csv", ["", "all", "s2w"], [[i, a, False] for i, a in enumerate(subtask_all)])
    for k in keys:
        touch_image(folder / "images" / f"{k}.jpg")


def test_msls_val_protocol(tmp_path):
    root = tmp_path / "msls"
    # city A (northing ~ 6.17e6) and city B with the SAME numeric UTM as A (another zone): positives per city.
    for city in ("cph", "sf"):
        write_msls_side(root / "train_val" / city / "database", [f"{city}_d{i}" for i in range(4)],
                        [(1000, 0), (1020, 0), (5000, 0), (1000, 30)],
                        pano=[False, False, False, True], subtask_all=[True, True, True, True])
        write_msls_side(root / "train_val" / city / "query", [f"{city}_q{i}" for i in range(4)],
                        [(1000, 10), (9000, 0), (5000, 20), (1000, 25)],
                        pano=[False, False, True, False], subtask_all=[True, True, True, False])
    rs = load_msls(root, cities=("cph", "sf"))
    # Kept database: d0, d1, d2 per city (d3 is a panorama). Queries: q2 is a panorama, q3 outside the subtask,
    # q1 has no positive -> only q0 per city, with positives d0 (10 m) and d1 (sqrt(400 + 100) = 22.4 m).
    assert rs.name == "msls_val" and rs.num_database == 6
    assert [p.name for p in rs.query_paths] == ["cph_q0.jpg", "sf_q0.jpg"]
    assert [p.tolist() for p in rs.positives] == [[0, 1], [3, 4]]
    kept_all = load_msls(root, cities=("cph",), drop_queries_without_positive=False)
    assert [p.name for p in kept_all.query_paths] == ["cph_q0.jpg", "cph_q1.jpg"]
    with pytest.raises(DatasetLayoutError, match="mapillary.com"):
        load_msls(root, cities=("tokyo",))


# ------------------------------------------------------------------------------------------ folder+CSV


def test_folder_with_places(tmp_path):
    for name in ("a.jpg", "b.jpg", "c.jpg", "q1.jpg", "q2.jpg"):
        touch_image(tmp_path / "imgs" / name)
    write_csv(tmp_path / "images.csv", ["path", "role", "place"],
              [["imgs/a.jpg", "database", "p1"], ["imgs/b.jpg", "db", "p2"], ["imgs/c.jpg", "database", "p1"],
               ["imgs/q1.jpg", "query", "p1"], ["imgs/q2.jpg", "query", "p9"]])
    rs = load_folder(tmp_path)
    assert rs.num_database == 3 and rs.num_queries == 2
    assert [p.tolist() for p in rs.positives] == [[0, 2], []]


def test_folder_with_lat_lon_radius(tmp_path):
    for name in ("d0.jpg", "d1.jpg", "q.jpg"):
        touch_image(tmp_path / name)
    metre_in_lat = 180 / (np.pi * EARTH_RADIUS_M)
    write_csv(tmp_path / "images.csv", ["path", "role", "lat", "lon"],
              [["d0.jpg", "database", 45 + 24 * metre_in_lat, 7.0],    # 24 m north
               ["d1.jpg", "database", 45 + 26 * metre_in_lat, 7.0],    # 26 m north
               ["q.jpg", "query", 45.0, 7.0]])
    assert load_folder(tmp_path).positives[0].tolist() == [0]
    assert load_folder(tmp_path, positive_radius_m=30).positives[0].tolist() == [0, 1]


def test_folder_errors(tmp_path):
    touch_image(tmp_path / "a.jpg")
    write_csv(tmp_path / "images.csv", ["path", "role", "place"], [["a.jpg", "gallery", "1"]])
    with pytest.raises(DatasetFormatError, match="line 2: role"):
        load_folder(tmp_path)
    write_csv(tmp_path / "images.csv", ["path", "role", "place"], [["a.jpg", "query", "1"], ["b.jpg", "database", 1]])
    with pytest.raises(DatasetFormatError, match="image not found"):
        load_folder(tmp_path)
    write_csv(tmp_path / "images.csv", ["file", "role"], [["a.jpg", "query"]])
    with pytest.raises(DatasetFormatError, match="'path' and 'role'"):
        load_folder(tmp_path)
    with pytest.raises(DatasetLayoutError, match="path,role,place"):
        load_folder(tmp_path / "missing")
