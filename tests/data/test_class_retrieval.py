"""A class-labelled set as a retrieval benchmark: positives by class (brute force), the self-searched set's
invariants, and unreadable images skipped from a self-searched set without breaking query = database."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from class_labelled_files import write_class_folder

from aggzoo.data.class_folder import read_class_folder
from aggzoo.data.class_labelled import ClassLabelledImages
from aggzoo.data.class_retrieval import class_positives, class_retrieval_set
from aggzoo.data.image_policy import ImagePolicy, check_readable, drop_unreadable
from aggzoo.data.retrieval_set import RetrievalSet
from aggzoo.errors import ImageReadError


def test_class_positives_equal_brute_force() -> None:
    rng = np.random.default_rng(0)
    database, queries = rng.integers(0, 9, 70), rng.integers(0, 12, 30)  # some query classes absent: no positive
    for q, rows in enumerate(class_positives(queries, database)):
        assert rows.tolist() == [i for i in range(70) if database[i] == queries[q]]
    for q, rows in enumerate(class_positives(database, database, exclude_self=True)):
        assert rows.tolist() == [i for i in range(70) if database[i] == database[q] and i != q]


def test_a_self_searched_set_needs_the_same_paths(tmp_path: Path) -> None:
    paths = tuple(tmp_path / f"{i}.jpg" for i in range(3))
    positives = (np.array([1]), np.array([0]), np.array([], dtype=np.int64))
    benchmark = RetrievalSet("s", paths, paths, positives, queries_are_database=True)
    assert benchmark.image_paths == paths and benchmark.num_candidates == 2
    with pytest.raises(ValueError, match="queries_are_database"):
        RetrievalSet("s", paths, paths[::-1], positives, queries_are_database=True)
    plain = RetrievalSet("s", paths, paths[:2], positives[:2])
    assert plain.image_paths == paths + paths[:2] and plain.num_candidates == 3


def test_class_retrieval_set_of_queries_and_gallery(tmp_path: Path) -> None:
    gallery = ClassLabelledImages("g", tuple(tmp_path / f"g{i}.jpg" for i in range(4)), np.array([3, 1, 3, 2]))
    queries = ClassLabelledImages("q", (tmp_path / "q0.jpg", tmp_path / "q1.jpg"), np.array([3, 7]))
    benchmark = class_retrieval_set(gallery, queries, name="shop")
    assert [p.tolist() for p in benchmark.positives] == [[0, 2], []]
    assert not benchmark.queries_are_database and benchmark.queries_without_positive == 1


def test_an_unreadable_image_leaves_the_database_and_the_queries_together(tmp_path: Path) -> None:
    root = write_class_folder(tmp_path / "mine", {"a": 3, "b": 3})
    (root / "a" / "1.jpg").write_bytes(b"not a jpeg")
    benchmark = class_retrieval_set(read_class_folder(root))
    with pytest.raises(ImageReadError, match="1 of 6 images"):  # each image scanned once, not as query and database
        check_readable(benchmark)
    reduced, counts = drop_unreadable(benchmark, ImagePolicy.coerce("skip"))
    assert counts == {"skipped_database_images": 1, "skipped_queries": 1}
    assert reduced.queries_are_database and reduced.query_paths == reduced.database_paths
    assert root / "a" / "1.jpg" not in reduced.database_paths
    labels = np.array([0, 0, 1, 1, 1])
    assert [p.tolist() for p in reduced.positives] == [p.tolist() for p in class_positives(labels, labels,
                                                                                          exclude_self=True)]
