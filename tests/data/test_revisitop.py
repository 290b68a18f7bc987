"""The revisitop reader on a folder in the published layout (real JPEGs, a real pickled ``gnd_*.pkl``),
the R1M append, the layout and format errors, and the query crop."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from PIL import Image
from revisitop_files import DATABASE, GND, QUERIES, jpeg_of_noise, write_r1m, write_revisitop

from aggzoo.data.retrieval_set import ImageListDataset
from aggzoo.data.revisitop import load_revisitop, read_r1m_list
from aggzoo.errors import DatasetFormatError, DatasetLayoutError, UnsafeDataFileError


def _as_lists(arrays) -> list[list[int]]:
    return [a.tolist() for a in arrays]


def test_reads_paths_setups_boxes_and_metrics(tmp_path):
    root = write_revisitop(tmp_path / "roxford5k")
    rs = load_revisitop(root)
    assert rs.name == "roxford5k" and rs.metrics == ("map", "mp")
    assert rs.database_paths == tuple(root / "jpg" / f"{n}.jpg" for n in DATABASE)
    assert rs.query_paths == tuple(root / "jpg" / f"{n}.jpg" for n in QUERIES)
    assert rs.query_boxes == ((136.5, 34.25, 180.5, 100.75), (2.0, 3.0, 30.0, 41.0), (0.4, 0.6, 63.5, 47.5))
    assert set(rs.setups) == {"easy", "medium", "hard"}
    # Easy: positives easy, junk junk + hard; Medium: easy + hard, junk; Hard: hard, junk + easy.
    assert _as_lists(rs.setups["easy"].positives) == [[0, 3], [], [4]]
    assert _as_lists(rs.setups["easy"].junk) == [[1, 5, 7], [2, 6], [0]]
    assert _as_lists(rs.setups["medium"].positives) == [[0, 3, 5], [2, 6], [4]]
    assert _as_lists(rs.setups["medium"].junk) == [[1, 7], [], [0]]
    assert _as_lists(rs.setups["hard"].positives) == [[5], [2, 6], []]
    assert _as_lists(rs.setups["hard"].junk) == [[0, 1, 3, 7], [], [0, 4]]
    assert _as_lists(rs.positives) == _as_lists(rs.setups["medium"].positives)  # the default is Medium
    assert _as_lists(rs.junk) == _as_lists(rs.setups["medium"].junk)
    assert all(a.dtype == np.int64 for truth in rs.setups.values() for a in (*truth.positives, *truth.junk))
    with pytest.raises(TypeError):
        rs.setups["easy"] = rs.setups["hard"]  # read-only, like the frozen set that holds it


def test_rparis_names_its_pickle(tmp_path):
    root = write_revisitop(tmp_path / "rparis6k", dataset="rparis6k")
    assert load_revisitop(root, dataset="rparis6k", name="paris").name == "paris"
    with pytest.raises(DatasetLayoutError, match="gnd_roxford5k.pkl"):
        load_revisitop(root)  # the Oxford pickle is not there


def test_r1m_distractors_follow_the_database_and_leave_the_ground_truth(tmp_path):
    root = write_revisitop(tmp_path / "roxford5k")
    lines = ["0/00/000a1b.jpg", "0/00/000a1c.jpg", "", "1/ff/ffe0 12.jpg", "no_extension"]
    r1m = write_r1m(tmp_path / "revisitop1m", lines)
    plain, rs = load_revisitop(root), load_revisitop(root, distractors=r1m)
    assert rs.name == "roxford5k_r1m" and rs.num_database == len(DATABASE) + 4
    assert rs.database_paths[: len(DATABASE)] == plain.database_paths
    assert rs.database_paths[len(DATABASE):] == (
        r1m / "jpg/0/00/000a1b.jpg", r1m / "jpg/0/00/000a1c.jpg", r1m / "jpg/1/ff/ffe0 12.jpg", r1m / "jpg/no_extension.jpg")
    assert read_r1m_list(r1m) == rs.database_paths[len(DATABASE):]
    for setup in ("easy", "medium", "hard"):
        assert _as_lists(rs.setups[setup].positives) == _as_lists(plain.setups[setup].positives)
        assert _as_lists(rs.setups[setup].junk) == _as_lists(plain.setups[setup].junk)
    assert rs.query_paths == plain.query_paths and rs.query_boxes == plain.query_boxes


@pytest.mark.parametrize("remove, where", [
    ("root", "roxford5k folder not found"),
    ("gnd_roxford5k.pkl", "roxford5k ground truth not found"),
    ("jpg", "roxford5k image folder not found"),
    ("jpg/ashmolean_000000.jpg", "1 of 11 images listed in gnd_roxford5k.pkl are missing"),
])
def test_missing_parts_name_the_layout_and_the_source(tmp_path, remove, where):
    root = write_revisitop(tmp_path / "roxford5k")
    target = root if remove == "root" else root / remove
    if target.is_dir():
        shutil.rmtree(target)
    else:
        target.unlink()
    with pytest.raises(DatasetLayoutError) as err:
        load_revisitop(root)
    message = str(err.value)
    assert where in message and "Expected layout: <root>/jpg/<name>.jpg and <root>/gnd_roxford5k.pkl" in message
    assert "oxbuildings" in message and "cmp.felk.cvut.cz/revisitop" in message


@pytest.mark.parametrize("remove, where", [
    ("folder", "R1M distractor folder not found"),
    ("revisitop1m.txt", "R1M image list not found"),
    ("jpg/0/00/000a1c.jpg", "1 of 2 images checked (the first and the last of revisitop1m.txt) are missing"),
])
def test_missing_r1m_parts_name_the_layout_and_the_source(tmp_path, remove, where):
    root = write_revisitop(tmp_path / "roxford5k")
    r1m = write_r1m(tmp_path / "revisitop1m", ["0/00/000a1b.jpg", "0/00/000a1c.jpg"])
    target = r1m if remove == "folder" else r1m / remove
    if remove == "folder":
        os.rename(r1m, tmp_path / "elsewhere")
    else:
        target.unlink()
    with pytest.raises(DatasetLayoutError) as err:
        load_revisitop(root, distractors=r1m)
    assert where in str(err.value) and "revisitop1m.txt" in str(err.value) and "ptak.felk.cvut.cz" in str(err.value)


@pytest.mark.parametrize("content, match", [
    ([1, 2, 3], "expected a dict with 'imlist', 'qimlist' and 'gnd'"),
    ({"imlist": DATABASE, "qimlist": QUERIES}, "expected a dict with 'imlist', 'qimlist' and 'gnd'"),
    ({"imlist": DATABASE, "qimlist": QUERIES, "gnd": GND[:2]}, "3 query names but 2 'gnd' entries"),
    ({"imlist": DATABASE, "qimlist": [1, 2, 3], "gnd": GND}, "'qimlist' must be a list of image names"),
    ({"imlist": DATABASE, "qimlist": QUERIES, "gnd": [GND[0], GND[1], {**GND[2], "easy": [8]}]},
     "query 2 lists database index 8, outside"),
    ({"imlist": DATABASE, "qimlist": QUERIES, "gnd": [GND[0], GND[1], {"bbx": [0, 0, 1, 1], "easy": [], "junk": []}]},
     "gnd\\[2\\] has no 'hard' list"),
    ({"imlist": DATABASE, "qimlist": QUERIES, "gnd": [GND[0], GND[1], {**GND[2], "bbx": [1, 2, 3]}]},
     "gnd\\[2\\]\\['bbx'\\] must be \\[x1, y1, x2, y2\\]"),
    ({"imlist": DATABASE, "qimlist": QUERIES, "gnd": [GND[0], GND[1], {**GND[2], "bbx": [5, 5, 1, 9]}]},
     "the box of query 2 is"),
], ids=["not-a-dict", "no-gnd", "short-gnd", "bad-names", "index-out-of-range", "no-hard", "short-box", "empty-box"])
def test_malformed_ground_truth_is_one_format_error_naming_the_file(tmp_path, content, match):
    root = write_revisitop(tmp_path / "roxford5k")
    (root / "gnd_roxford5k.pkl").write_bytes(pickle.dumps(content))
    with pytest.raises(DatasetFormatError, match=match) as err:
        load_revisitop(root)
    assert "roxford5k" in str(err.value)


def test_not_a_pickle_is_one_format_error(tmp_path):
    root = write_revisitop(tmp_path / "roxford5k")
    (root / "gnd_roxford5k.pkl").write_text("imlist,qimlist\n")
    with pytest.raises(DatasetFormatError, match="cannot read the revisitop ground truth as a pickle"):
        load_revisitop(root)


class _TouchesOnLoad:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return os.system, (f"touch {self.marker}",)


def test_a_crafted_gnd_pickle_is_refused_and_runs_nothing(tmp_path):
    root = write_revisitop(tmp_path / "roxford5k")
    marker = tmp_path / "ran"
    gnd = [dict(g) for g in GND]
    gnd[1]["junk"] = _TouchesOnLoad(marker)
    (root / "gnd_roxford5k.pkl").write_bytes(pickle.dumps({"imlist": DATABASE, "qimlist": QUERIES, "gnd": gnd}))
    with pytest.raises(UnsafeDataFileError, match="refusing the global posix.system") as err:
        load_revisitop(root)
    assert str(root / "gnd_roxford5k.pkl") in str(err.value) and "Nothing in the file was run" in str(err.value)
    assert not marker.exists()


def test_bad_r1m_lines_are_refused(tmp_path):
    r1m = write_r1m(tmp_path / "revisitop1m", ["0/00/a.jpg"])
    (r1m / "revisitop1m.txt").write_text("0/00/a.jpg\n../../etc/passwd\n")
    with pytest.raises(DatasetFormatError, match="line 2: '../../etc/passwd' is not a path inside jpg/"):
        read_r1m_list(r1m)
    (r1m / "revisitop1m.txt").write_text("0/00/a.jpg\n/etc/passwd\n")
    with pytest.raises(DatasetFormatError, match="line 2: '/etc/passwd' is not a path inside jpg/"):
        read_r1m_list(r1m)
    (r1m / "revisitop1m.txt").write_text("\n\n")
    with pytest.raises(DatasetFormatError, match="lists no image"):
        read_r1m_list(r1m)


def test_a_dataset_name_cannot_hold_a_path(tmp_path):
    with pytest.raises(DatasetFormatError, match=r"revisitop dataset name '../x': letters, digits and _ only"):
        load_revisitop(tmp_path, dataset="../x")


def test_another_set_in_the_layout_is_read_under_its_own_name(tmp_path):
    """A set of one's own (here the test folder renamed) reads like the published ones, its gnd named after it."""
    root = write_revisitop(tmp_path / "mine", dataset="my_landmarks")
    loaded = load_revisitop(root, dataset="my_landmarks")
    assert loaded.name == "my_landmarks" and loaded.num_queries == len(QUERIES)
    with pytest.raises(DatasetLayoutError, match="gnd_oxford5k.pkl"):
        load_revisitop(root, dataset="oxford5k")


# -- the query crop --------------------------------------------------------------------------------

def _as_tensor(image: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.array(image)).permute(2, 0, 1)  # a writable copy


def _pil_crop(path: Path, box) -> np.ndarray:
    """What revisitop's python/example_process_images.py extracts: ``Image.open(...).convert('RGB').crop(bbx)``."""
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB").crop(tuple(box)))


def test_image_list_dataset_crops_queries_as_revisitop_does(tmp_path):
    root = write_revisitop(tmp_path / "roxford5k")
    rs = load_revisitop(root)
    crops = ImageListDataset(rs.query_paths, _as_tensor, boxes=rs.query_boxes)
    # Every box lies inside its image, so the crop is exactly PIL's. The halves round to even:
    # query 0 (136.5, 34.25, 180.5, 100.75) -> (136, 34, 180, 101) of a 200x120 image;
    # query 1 (2, 3, 30, 41) as it is; query 2 (0.4, 0.6, 63.5, 47.5) -> (0, 1, 64, 48) of 64x48.
    for q, shape in enumerate([(3, 67, 44), (3, 38, 28), (3, 47, 64)]):
        image, index = crops[q]
        assert index == q and tuple(image.shape) == shape
        assert np.array_equal(image.permute(1, 2, 0).numpy(), _pil_crop(rs.query_paths[q], rs.query_boxes[q]))
    whole = ImageListDataset(rs.query_paths, _as_tensor)[0][0]
    assert np.array_equal(whole[:, 34:101, 136:180].numpy(), crops[0][0].numpy())  # a crop, not a resize


def test_a_box_past_the_border_is_clamped_where_pil_pads_black(tmp_path):
    path = tmp_path / "q.jpg"
    jpeg_of_noise(path, seed=7, size=(40, 30))
    box = (30.5, 20.5, 55.0, 44.0)  # rounds to (30, 20, 55, 44); the image ends at x = 40, y = 30
    cropped = ImageListDataset([path], _as_tensor, boxes=[box])[0][0].permute(1, 2, 0).numpy()
    padded = _pil_crop(path, box)
    assert padded.shape == (24, 25, 3) and cropped.shape == (10, 10, 3)
    assert np.array_equal(cropped, padded[:10, :10])  # the same pixels, without PIL's black border
    assert not padded[10:].any() and not padded[:, 10:].any()
    plain = ImageListDataset([path, path], _as_tensor, boxes=[None, (0, 0, 5, 5)])
    assert tuple(plain[0][0].shape) == (3, 30, 40) and tuple(plain[1][0].shape) == (3, 5, 5)
    outside = ImageListDataset([path], _as_tensor, boxes=[(50.0, 40.0, 60.0, 45.0)])
    with pytest.raises(DatasetFormatError, match="cannot crop the query: the box .* lies outside the 40x30 image"):
        outside[0]
    with pytest.raises(ValueError, match="2 images but 1 boxes"):
        ImageListDataset([path, path], _as_tensor, boxes=[None])


# -- the shipped benchmark configs -------------------------------------------------------------------

@pytest.mark.parametrize("benchmark, database", [
    ("roxford5k", 8), ("rparis6k", 8), ("roxford5k_r1m", 8 + 2), ("rparis6k_r1m", 8 + 2)])
def test_shipped_configs_load_the_published_layout(tmp_path, benchmark, database):
    data_root = tmp_path / "data"
    write_revisitop(data_root / "roxford5k")
    write_revisitop(data_root / "rparis6k", dataset="rparis6k")
    write_r1m(data_root / "revisitop1m", ["0/00/a.jpg", "0/01/b.jpg"])
    config = Path(__file__).resolve().parents[2] / "conf" / "benchmark" / f"{benchmark}.yaml"
    cfg = OmegaConf.create({"paths": {"data_root": str(data_root)}, "benchmark": OmegaConf.load(config)})
    rs = instantiate(cfg.benchmark[benchmark])
    assert rs.name == benchmark and rs.num_database == database and rs.num_queries == 3
    assert rs.database_paths[0].parent == data_root / benchmark.removesuffix("_r1m") / "jpg"
    assert set(rs.setups) == {"easy", "medium", "hard"} and rs.metrics == ("map", "mp")


def test_skipping_unreadable_images_reindexes_junk_setups_and_boxes(tmp_path):
    """bad_images=skip on a revisitop set: database image 1 and query 1 unreadable. Every list of a kept query
    (positives, junk, each setup) loses image 1 and shifts the ids above it down by one; query 1's box goes too."""
    from aggzoo.data.image_policy import ImagePolicy, drop_unreadable

    root = write_revisitop(tmp_path / "roxford5k")
    (root / "jpg" / f"{DATABASE[1]}.jpg").write_bytes(b"not a jpeg")
    (root / "jpg" / f"{QUERIES[1]}.jpg").write_bytes(b"not a jpeg")
    loaded = load_revisitop(root)
    reduced, counts = drop_unreadable(loaded, ImagePolicy(on_error="skip", log_path=tmp_path / "bad.tsv"))
    assert counts == {"skipped_database_images": 1, "skipped_queries": 1}

    def moved(ids):  # the expected ids after image 1 left: written from the rule, not from the code
        return sorted(i - (i > 1) for i in ids if i != 1)

    kept_queries = [0, 2]
    for setup, (positive_keys, junk_keys) in {"easy": (["easy"], ["junk", "hard"]), "medium": (["easy", "hard"], ["junk"]),
                                               "hard": (["hard"], ["junk", "easy"])}.items():
        truth = reduced.setups[setup]
        for new_q, old_q in enumerate(kept_queries):
            assert list(truth.positives[new_q]) == moved({i for k in positive_keys for i in GND[old_q][k]})
            assert list(truth.junk[new_q]) == moved({i for k in junk_keys for i in GND[old_q][k]})
    assert _as_lists(reduced.junk) == _as_lists(reduced.setups["medium"].junk)
    assert reduced.query_boxes == (loaded.query_boxes[0], loaded.query_boxes[2])
