"""Property-based tests: the VG file-name parser and Recall@k against a brute-force reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggzoo.data.vg import utm_from_name
from aggzoo.errors import DatasetFormatError
from aggzoo.evaluation.metrics import recall_at_k, recall_curve
from aggzoo.evaluation.search import search

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

coordinate = st.floats(min_value=-1e7, max_value=1e7, allow_nan=False, allow_infinity=False)
# Free text of the other fields: anything without the separator or a path separator.
field_text = st.text(alphabet=st.characters(blacklist_characters="@/\x00", blacklist_categories=("Cs",)), max_size=12)
formats = st.sampled_from([repr, lambda x: f"{x:.2f}", lambda x: f"{x:.6e}", lambda x: f"{x:015.3f}"])


@SETTINGS
@given(east=coordinate, north=coordinate, fmt=formats, rest=st.lists(field_text, min_size=1, max_size=8),
       folder=st.sampled_from(["", "db/", "/data/pitts30k/images/test/queries/"]),
       ext=st.sampled_from([".jpg", ".png", ".JPEG"]))
def test_utm_names_parse_to_their_coordinates(east: float, north: float, fmt, rest: list[str], folder: str,
                                              ext: str) -> None:
    name = f"{folder}@{fmt(east)}@{fmt(north)}@{'@'.join(rest)}@{ext}"
    parsed = utm_from_name(name)
    assert parsed == (float(fmt(east)), float(fmt(north)))


number = st.builds(lambda x, f: f(x), coordinate, formats)
word = st.text(alphabet="ghijklmnopqrstuvwxyzGHIJKLMNOPQRSTUVWXYZ_#", min_size=1, max_size=6)
malformed_names = st.one_of(
    # no leading '@' (a name from another format, e.g. '000123.jpg' or 'img@...')
    st.builds(lambda w, e, n: f"{w}@{e}@{n}@33@T@.jpg", word, number, number),
    # too few fields: the name ends right after the coordinates
    st.builds(lambda e, n: f"@{e}@{n}.jpg", number, number),
    st.builds(lambda e: f"@{e}.jpg", number),
    # a coordinate that is not a number: text after it, or empty
    st.builds(lambda e, w, n: f"@{e}{w}@{n}@33@T@.jpg", number, word, number),
    st.builds(lambda e, n, w: f"@{e}@{w}{n}@33@T@.jpg", number, number, word),
    st.builds(lambda n: f"@@{n}@33@T@.jpg", number),
)


@SETTINGS
@given(name=malformed_names)
def test_malformed_names_raise_naming_the_file(name: str) -> None:
    with pytest.raises(DatasetFormatError) as info:
        utm_from_name(f"/data/x/{name}")
    assert f"/data/x/{name}" in str(info.value)
    assert "VG image names must start with '@<UTM_east>@<UTM_north>@'" in str(info.value)


@pytest.mark.parametrize("bad", ["@nan@1@x@.jpg", "@inf@1@x@.jpg", "@1@-inf@x@.jpg", "@1e999@0@x@.jpg"])
def test_non_finite_coordinates_are_rejected(bad: str) -> None:
    with pytest.raises(DatasetFormatError, match="non-finite coordinate"):
        utm_from_name(bad)


def _brute_force_recall(database: np.ndarray, queries: np.ndarray, positives: list[set[int]], k: int) -> float:
    """Rank the whole database by inner product (ties by index), count queries with a positive in the top k."""
    hits = 0
    for q, query in enumerate(queries):
        scores = [float(np.dot(query.astype(np.float64), d.astype(np.float64))) for d in database]
        ranking = sorted(range(len(database)), key=lambda i: (-scores[i], i))
        hits += any(i in positives[q] for i in ranking[:k])
    return hits / len(queries)


@SETTINGS
@given(data=st.data(), num_db=st.integers(1, 12), num_q=st.integers(1, 6), dim=st.integers(1, 4))
def test_recall_at_k_matches_brute_force(data: st.DataObject, num_db: int, num_q: int, dim: int) -> None:
    # Small integer vectors: exact float32 inner products, and plenty of ties to order by index.
    values = st.integers(-3, 3)
    database = np.array(data.draw(st.lists(st.lists(values, min_size=dim, max_size=dim), min_size=num_db,
                                           max_size=num_db)), dtype=np.float32)
    queries = np.array(data.draw(st.lists(st.lists(values, min_size=dim, max_size=dim), min_size=num_q,
                                          max_size=num_q)), dtype=np.float32)
    positives = [data.draw(st.sets(st.integers(0, num_db - 1), max_size=num_db)) for _ in range(num_q)]
    ks = sorted(data.draw(st.sets(st.integers(1, num_db), min_size=1, max_size=4)))
    predictions = search(database, queries, max(ks))
    arrays = [np.array(sorted(p), dtype=np.int64) for p in positives]
    recalls = recall_at_k(predictions, arrays, ks)
    for k in ks:
        assert recalls[k] == pytest.approx(_brute_force_recall(database, queries, positives, k), abs=1e-12)
    curve = recall_curve(predictions, arrays)
    assert np.all(np.diff(curve) >= 0) and curve[-1] <= 1.0
