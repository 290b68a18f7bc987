"""The class-labelled readers on folders written in each published layout (real JPEGs, a real ``.mat``): paths,
labels, the splits' class counts, and one clear error naming the layout for a missing or malformed file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.io
from class_labelled_files import (
    write_cars,
    write_cars_csvs,
    write_class_folder,
    write_cub,
    write_gldv2,
    write_inshop,
    write_sop,
)

from aggzoo.data.class_folder import class_names, load_class_folder, read_class_folder
from aggzoo.data.gldv2 import read_gldv2_clean
from aggzoo.data.metric_learning import (
    load_metric_learning,
    read_cars196,
    read_cub200,
    read_inshop,
    read_sop,
)
from aggzoo.errors import DatasetFormatError, DatasetLayoutError

LANDMARKS = {7: ["0a1b2c3d4e5f6071", "1b2c3d4e5f607182"], 3: ["fedcba9876543210"],
             42: ["00112233aabbccdd", "a0b1c2d3e4f50617", "9f8e7d6c5b4a3921", "abcabcabcabcabc1"]}


# -- GLDv2-clean -----------------------------------------------------------------------------------


def test_gldv2_clean_lists_the_csv_images_at_their_abc_paths(tmp_path: Path) -> None:
    root = write_gldv2(tmp_path / "gldv2", LANDMARKS)
    images = read_gldv2_clean(root)
    ids = [i for v in LANDMARKS.values() for i in v]
    assert [p.name for p in images.paths] == [f"{i}.jpg" for i in ids]
    assert images.paths[0] == root / "train" / "0" / "a" / "1" / "0a1b2c3d4e5f6071.jpg"
    assert all(p.is_file() for p in images.paths)
    assert images.labels.tolist() == [7, 7, 3, 42, 42, 42, 42]
    assert images.classes.tolist() == [3, 7, 42] and images.name == "gldv2_clean"


def test_gldv2_min_images_per_landmark_drops_small_landmarks(tmp_path: Path) -> None:
    root = write_gldv2(tmp_path / "gldv2", LANDMARKS)
    assert read_gldv2_clean(root, min_images_per_landmark=2).classes.tolist() == [7, 42]
    assert read_gldv2_clean(root, min_images_per_landmark=4).labels.tolist() == [42] * 4


@pytest.mark.parametrize("csv_text, fragment", [
    ("id,landmark_id\nabc,1\n", "header"),
    ("landmark_id,images\nseven,0a1b2c3d4e5f6071\n", "line 2"),
    ("landmark_id,images\n7,0a1b/../../etc\n", "letters and digits"),
    ("landmark_id,images\n7,0a1b2c3d4e5f6071\n8,0a1b2c3d4e5f6071\n", "more than once"),
])
def test_gldv2_malformed_csv_is_one_format_error(tmp_path: Path, csv_text: str, fragment: str) -> None:
    root = write_gldv2(tmp_path / "gldv2", LANDMARKS)
    (root / "train_clean.csv").write_text(csv_text)
    with pytest.raises(DatasetFormatError, match=fragment) as err:
        read_gldv2_clean(root)
    assert "train_clean.csv" in str(err.value)


def test_gldv2_missing_csv_or_image_names_the_layout(tmp_path: Path) -> None:
    root = write_gldv2(tmp_path / "gldv2", LANDMARKS)
    with pytest.raises(DatasetLayoutError, match="train_clean.csv") as err:
        read_gldv2_clean(root, csv_name="other.csv")
    assert "<root>/train/<a>/<b>/<c>/<id>.jpg" in str(err.value) and "google-landmark" in str(err.value)
    (root / "train" / "a" / "b" / "c" / "abcabcabcabcabc1.jpg").unlink()  # the last image listed
    with pytest.raises(DatasetLayoutError, match="abcabcabcabcabc1.jpg") as err:
        read_gldv2_clean(root)
    assert "Expected layout" in str(err.value)


# -- class folder ----------------------------------------------------------------------------------


def test_class_folder_numbers_sorted_class_names_like_imagefolder(tmp_path: Path) -> None:
    root = write_class_folder(tmp_path / "mine", {"zebra": 2, "ant": 3, "moth": 1})
    (root / "ant" / "notes.txt").write_text("not an image")
    (root / "moth" / "more").mkdir()
    write_class_folder(root / "moth" / "more", {"deeper": 1})  # nested: moth/more/deeper/0.jpg
    images = read_class_folder(root)
    assert class_names(root) == ("ant", "moth", "zebra")
    assert images.labels.tolist() == [0, 0, 0, 1, 1, 2, 2]
    assert [p.relative_to(root).as_posix() for p in images.paths] == [
        "ant/0.jpg", "ant/1.jpg", "ant/2.jpg", "moth/0.jpg", "moth/more/deeper/0.jpg", "zebra/0.jpg", "zebra/1.jpg"]


def test_class_folder_matches_torchvision_imagefolder(tmp_path: Path) -> None:
    datasets = pytest.importorskip("torchvision.datasets")
    root = write_class_folder(tmp_path / "mine", {"b": 2, "a": 3, "c10": 1, "c2": 2})
    reference = datasets.ImageFolder(str(root))
    images = read_class_folder(root)
    assert [(Path(p), c) for p, c in reference.samples] == list(zip(images.paths, images.labels.tolist()))


def test_class_folder_errors_name_the_layout(tmp_path: Path) -> None:
    with pytest.raises(DatasetLayoutError, match="ImageFolder"):
        read_class_folder(tmp_path / "absent")
    (tmp_path / "flat").mkdir()
    write_class_folder(tmp_path, {"flat": 0})
    with pytest.raises(DatasetLayoutError, match="no class sub-folder"):
        read_class_folder(tmp_path / "flat")
    root = write_class_folder(tmp_path / "mine", {"a": 2})
    (root / "empty").mkdir()
    with pytest.raises(DatasetLayoutError, match="hold no image.*empty"):
        read_class_folder(root)


def test_load_class_folder_searches_every_image_against_the_others(tmp_path: Path) -> None:
    root = write_class_folder(tmp_path / "mine", {"a": 3, "b": 2})
    benchmark = load_class_folder(root)
    assert benchmark.queries_are_database and benchmark.num_candidates == 4
    assert benchmark.query_paths == benchmark.database_paths
    assert [p.tolist() for p in benchmark.positives] == [[1, 2], [0, 2], [0, 1], [4], [3]]
    assert set(benchmark.metrics) == {"recall", "map_at_r", "r_precision"}


# -- metric-learning benchmarks --------------------------------------------------------------------


@pytest.mark.parametrize("split, first, last", [("train", 1, 100), ("test", 101, 200)])
def test_cub200_splits_are_the_halves_of_the_classes(tmp_path: Path, split: str, first: int, last: int) -> None:
    root = write_cub(tmp_path / "cub")
    images = read_cub200(root, split)
    assert images.classes.tolist() == list(range(first, last + 1))      # 100 classes each
    assert len(images) == 200 and images.name == f"cub200_{split}"
    assert all(p.is_file() and p.parent.name.startswith(f"{lab:03d}.") for p, lab in zip(images.paths, images.labels))
    assert read_cub200(root / "CUB_200_2011", split).paths == images.paths  # the dataset folder itself works too


@pytest.mark.parametrize("split, first, last", [("train", 1, 98), ("test", 99, 196)])
def test_cars196_splits_read_from_cars_annos_mat(tmp_path: Path, split: str, first: int, last: int) -> None:
    root = write_cars(tmp_path / "cars196")
    images = read_cars196(root, split)
    assert images.classes.tolist() == list(range(first, last + 1))      # 98 classes each
    assert len(images) == 196
    offset = 0 if split == "train" else 196
    assert images.paths[0] == root / "car_ims" / f"{offset + 1:06d}.jpg"  # the .mat's order
    assert images.labels[:3].tolist() == [first, first, first + 1]


@pytest.mark.parametrize("split", ["train", "test"])
def test_cars196_reads_pytorch_metric_learnings_copy(tmp_path: Path, split: str) -> None:
    root = write_cars_csvs(tmp_path / "cars196")
    images = read_cars196(root, split)
    assert images.classes.tolist() == list(range(1, 99) if split == "train" else range(99, 197))
    # a class name with "/" names its folder with "-"; class c's image j = 0 is train file c, j = 1 test file c
    c = 50 if split == "train" else 100
    assert root / "car_data" / "car_data" / split / f"Make {c} C-V {2000 + c}" / f"{c:05d}.jpg" in images.paths


@pytest.mark.parametrize("split", ["train", "test"])
@pytest.mark.parametrize("dataset, write, reader, theirs", [
    ("cub200", write_cub, read_cub200, "CUB"),
    ("cars196", write_cars_csvs, read_cars196, "Cars196"),
    ("sop", write_sop, read_sop, "StanfordOnlineProducts"),
])
def test_readers_equal_pytorch_metric_learnings_datasets(tmp_path: Path, split: str, dataset: str, write, reader,
                                                         theirs: str) -> None:
    """pytorch-metric-learning's dataset classes read the same folder: same images, same labels, same order."""
    datasets = pytest.importorskip("pytorch_metric_learning.datasets")
    root = write(tmp_path / dataset)
    reference = getattr(datasets, theirs)(str(root), split=split)
    images = reader(root, split)
    assert [Path(p) for p in reference.paths] == list(images.paths)
    assert list(reference.labels) == images.labels.tolist()


def test_sop_splits_read_the_ebay_lists(tmp_path: Path) -> None:
    root = write_sop(tmp_path / "sop")
    train, test = read_sop(root, "train"), read_sop(root, "test")
    assert train.classes.tolist() == [1, 2, 3, 4] and test.classes.tolist() == [5, 6, 7]
    assert len(train) == 8 and len(test) == 6
    assert test.paths[0] == root / "Stanford_Online_Products" / "bicycle_final" / "5_0.JPG"


INSHOP_ROWS = [(1, "train"), (1, "train"), (2, "train"), (2, "train"), (5, "query"), (5, "gallery"), (5, "gallery"),
               (9, "query"), (9, "query"), (9, "gallery")]


def test_inshop_splits_and_query_gallery_benchmark(tmp_path: Path) -> None:
    root = write_inshop(tmp_path / "inshop", INSHOP_ROWS)
    assert read_inshop(root, "train").labels.tolist() == [1, 1, 2, 2]
    query, gallery = read_inshop(root, "query"), read_inshop(root, "gallery")
    assert query.labels.tolist() == [5, 9, 9] and gallery.labels.tolist() == [5, 5, 9]
    assert query.paths[0] == root / "Img" / "img" / "WOMEN" / "Dresses" / "id_00000005" / "04_1_front.jpg"
    benchmark = load_metric_learning(root, dataset="inshop")
    assert not benchmark.queries_are_database and benchmark.name == "inshop_test"
    assert benchmark.database_paths == gallery.paths and benchmark.query_paths == query.paths
    assert [p.tolist() for p in benchmark.positives] == [[0, 1], [2], [2]]


@pytest.mark.parametrize("dataset, write", [("cub200", write_cub), ("cars196", write_cars), ("sop", write_sop)])
def test_load_metric_learning_excludes_each_query_from_its_positives(tmp_path: Path, dataset: str, write) -> None:
    benchmark = load_metric_learning(write(tmp_path / dataset), dataset=dataset, split="test")
    assert benchmark.queries_are_database and benchmark.name == f"{dataset}_test"
    assert all(q not in p and len(p) == 1 for q, p in enumerate(benchmark.positives))  # 2 images per class


@pytest.mark.parametrize("reader, write, damage, error, fragment", [
    (read_cub200, write_cub, lambda r: (r / "CUB_200_2011" / "image_class_labels.txt").unlink(), DatasetLayoutError,
     "image_class_labels.txt"),
    (read_cub200, write_cub, lambda r: (r / "CUB_200_2011" / "images.txt").write_text("1 a.jpg extra\n"),
     DatasetFormatError, "expected 2 fields"),
    (read_cub200, write_cub, lambda r: (r / "CUB_200_2011" / "images" / "001.Bird_1" / "Bird_1_0.jpg").unlink(),
     DatasetLayoutError, "are missing"),
    (read_cars196, write_cars, lambda r: (r / "cars_annos.mat").write_bytes(b"not a mat file at all" * 10),
     DatasetFormatError, "cannot read as a MATLAB"),
    (read_cars196, write_cars, lambda r: scipy.io.savemat(r / "cars_annos.mat", {"labels": np.arange(3)}),
     DatasetFormatError, "struct array 'annotations'"),
    (read_sop, write_sop, lambda r: (r / "Stanford_Online_Products" / "Ebay_train.txt").write_text("id path\n"),
     DatasetFormatError, "header"),
    (read_inshop, lambda r: write_inshop(r, INSHOP_ROWS),
     lambda r: (r / "Eval" / "list_eval_partition.txt").write_text("12\nimage_name item_id evaluation_status\n"),
     DatasetFormatError, "announces 12 images"),
    (read_inshop, lambda r: write_inshop(r, INSHOP_ROWS), lambda r: (r / "Eval" / "list_eval_partition.txt").unlink(),
     DatasetLayoutError, "list_eval_partition.txt"),
])
def test_missing_or_malformed_files_name_the_layout(tmp_path: Path, reader, write, damage, error, fragment) -> None:
    root = write(tmp_path / "data")
    damage(root)
    with pytest.raises(error, match=fragment) as err:
        reader(root, "train")
    assert "Expected layout" in str(err.value)


def test_unknown_split_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DatasetFormatError, match="splits"):
        read_cub200(write_cub(tmp_path / "cub", classes=2), "val")
