"""RetrievalSet keeps its old positional form and checks the optional ground truth it now carries."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from aggzoo.data.retrieval_set import GroundTruth, RetrievalSet
from aggzoo.errors import DatasetFormatError

DB = (Path("d0.jpg"), Path("d1.jpg"), Path("d2.jpg"))
QUERIES = (Path("q0.jpg"), Path("q1.jpg"))
POSITIVES = (np.array([0]), np.array([], dtype=np.int64))


def test_the_old_positional_form_still_builds_a_place_recognition_set():
    rs = RetrievalSet("vpr", DB, QUERIES, POSITIVES)
    assert (rs.num_database, rs.num_queries, rs.queries_without_positive) == (3, 2, 1)
    assert rs.junk is None and rs.query_boxes is None and rs.setups is None and rs.metrics == ("recall",)
    assert rs.ground_truth.positives is POSITIVES and rs.ground_truth.junk is None


def test_optional_ground_truth_is_kept():
    junk = (np.array([1]), np.array([2]))
    setups = {"easy": GroundTruth(POSITIVES, junk), "hard": GroundTruth(POSITIVES)}
    rs = RetrievalSet("r", DB, QUERIES, POSITIVES, junk=junk, query_boxes=((0, 0, 4, 4), None),
                      setups=setups, metrics="map")
    assert rs.metrics == ("map",) and rs.query_boxes == ((0, 0, 4, 4), None)
    assert rs.ground_truth.junk is junk and list(rs.setups) == ["easy", "hard"]
    setups["medium"] = GroundTruth(POSITIVES)  # the caller's dict changing later does not change the set
    assert "medium" not in rs.setups


@pytest.mark.parametrize("kwargs, error, match", [
    ({"positives": POSITIVES[:1]}, ValueError, "2 queries but 1 positive lists"),
    ({"junk": (np.array([1]),)}, ValueError, "2 queries but 1 junk lists"),
    ({"query_boxes": ((0, 0, 1, 1),)}, ValueError, "2 queries but 1 box lists"),
    ({"query_boxes": ((0, 0, 1, 1), (3, 0, 2, 1))}, DatasetFormatError, "the box of query 1 is"),
    ({"query_boxes": ((0, 0, 1, 1), (0, 0, float("nan"), 1))}, DatasetFormatError, "the box of query 1 is"),
    ({"setups": {"easy": GroundTruth(POSITIVES[:1])}}, ValueError, "setup 'easy': 2 queries but 1 positive lists"),
    ({"setups": {"easy": POSITIVES}}, TypeError, "setup 'easy' is a tuple, not a GroundTruth"),
    ({"metrics": ()}, ValueError, "metrics must be a non-empty tuple of names"),
])
def test_inconsistent_lengths_and_boxes_are_refused(kwargs, error, match):
    arguments = {"name": "r", "database_paths": DB, "query_paths": QUERIES, "positives": POSITIVES, **kwargs}
    with pytest.raises(error, match=match):
        RetrievalSet(**arguments)


def test_ground_truth_checks_its_junk_length():
    with pytest.raises(ValueError, match="2 queries but 1 junk lists"):
        GroundTruth(POSITIVES, (np.array([0]),))
