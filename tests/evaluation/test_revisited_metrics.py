"""mAP and mP@k of the revisited Oxford / Paris protocol.

The reference below is written from the protocol text (REFERENCE.md section 9 and the revisitop
paper): the precision-recall curve of the ranking without junk, one point per cut-off, and AP as the
trapezoids between consecutive points; P@k by counting the top k_q. It walks the ranking cut-off by
cut-off, where the module computes from the ranks of the positives, so the two share no code.
"""

from __future__ import annotations

import numpy as np
import pytest

from aggzoo.data.retrieval_set import GroundTruth
from aggzoo.evaluation.metrics import average_precision, precision_at_k, revisited_metrics

KS = (1, 5, 10)


# -- the reference, from the protocol text -------------------------------------------------------

def _scored_list(ranking, junk):
    """The ranking as revisitop scores it: padding (-1) and junk taken out, order kept."""
    junk = set(int(j) for j in junk)
    return [int(i) for i in ranking if i >= 0 and int(i) not in junk]


def reference_ap(ranking, positives, junk) -> float:
    """Area under the precision-recall curve of the junk-free ranking, by trapezoids between the
    points of consecutive cut-offs c = 0, 1, 2, ... (precision of the empty list taken as 1)."""
    positives = set(int(p) for p in positives)
    scored = _scored_list(ranking, junk)
    precision, recall = [1.0], [0.0]
    hits = 0
    for cut, item in enumerate(scored, start=1):
        hits += item in positives
        precision.append(hits / cut)
        recall.append(hits / len(positives))
    area = 0.0
    for c in range(1, len(precision)):
        area += (recall[c] - recall[c - 1]) * (precision[c - 1] + precision[c]) / 2
    return area


def reference_last_position(ranking, positives, junk) -> int:
    """One-based position of the last positive in the junk-free ranking."""
    positives = set(int(p) for p in positives)
    return max(position for position, item in enumerate(_scored_list(ranking, junk), start=1) if item in positives)


def reference_precision(ranking, positives, junk, k: int) -> float:
    """#positives among the first k_q of the junk-free ranking over k_q, with k_q the smaller of k and
    the (one-based) position of the last positive."""
    positives = set(int(p) for p in positives)
    scored = _scored_list(ranking, junk)
    k_q = min(reference_last_position(ranking, positives, junk), k)
    return sum(1 for item in scored[:k_q] if item in positives) / k_q


def _random_query(rng, num_database: int, empty: bool):
    """Disjoint positives and junk: few (1-3) or many (up to 30) positives, up to 30 junk."""
    ids = rng.permutation(num_database)
    few = rng.random() < 0.5
    num_positive = 0 if empty else int(rng.integers(1, 4 if few else min(30, num_database // 3)))
    num_junk = int(rng.integers(0, min(30, num_database // 3)))
    positives = np.sort(ids[:num_positive])
    junk = np.sort(ids[num_positive:num_positive + num_junk])
    return positives, junk


def _random_ranking(rng, num_database: int, positives, junk):
    """A ranking of the whole database from a model of random quality: positives (and junk) get a
    random boost, so some queries have every positive in the top 10 and some have none."""
    scores = rng.random(num_database)
    scores[positives] += rng.uniform(0.0, 1.5)
    scores[junk] += rng.uniform(0.0, 1.0)
    return np.argsort(-scores, kind="stable")


# -- (a) 200 random rankings against the reference -----------------------------------------------

def test_agrees_with_the_protocol_text_on_200_random_rankings():
    rng = np.random.default_rng(21)
    num_queries, num_database = 200, 120
    empty = rng.random(num_queries) < 0.1
    empty[:2] = True  # at least two queries without a positive, whatever the draw
    queries = [_random_query(rng, num_database, bool(e)) for e in empty]
    predictions = np.stack([_random_ranking(rng, num_database, *query) for query in queries])
    truth = GroundTruth(tuple(q[0] for q in queries), tuple(q[1] for q in queries))

    result = revisited_metrics(predictions, {"medium": truth}, ks=KS)["medium"]

    evaluated = [q for q in range(num_queries) if not empty[q]]
    expected_ap = [reference_ap(predictions[q], *queries[q]) for q in evaluated]
    assert result["queries"] == len(evaluated) and result["left_out"] == int(empty.sum()) >= 2
    assert result["incomplete"] == 0  # full rankings retrieve every positive
    assert result["map"] == pytest.approx(np.mean(expected_ap), abs=1e-9)
    for k in KS:
        expected = np.mean([reference_precision(predictions[q], *queries[q], k) for q in evaluated])
        assert result[f"mp@{k}"] == pytest.approx(expected, abs=1e-9)
    for q in evaluated:  # and query by query, not only on average
        assert average_precision(predictions[q], *queries[q]) == pytest.approx(expected_ap[evaluated.index(q)], abs=1e-9)
        for k in KS:
            assert precision_at_k(predictions[q], *queries[q], k=k) == pytest.approx(
                reference_precision(predictions[q], *queries[q], k), abs=1e-9)
    assert 0.0 < result["map"] < 1.0 and all(0.0 < result[f"mp@{k}"] <= 1.0 for k in KS)
    # Both branches of k_q were drawn: queries whose last positive is inside the top 10, and outside.
    last = [reference_last_position(predictions[q], *queries[q]) for q in evaluated]
    assert sum(position < 10 for position in last) > 20 and sum(position > 10 for position in last) > 20


def test_junk_changes_the_score_only_by_taking_items_out():
    """With junk, the score equals the score of the ranking with those items deleted and no junk."""
    rng = np.random.default_rng(3)
    for _ in range(50):
        ranking = rng.permutation(60)
        positives, junk = _random_query(rng, 60, empty=False)
        deleted = ranking[~np.isin(ranking, junk)]
        assert average_precision(ranking, positives, junk) == pytest.approx(average_precision(deleted, positives), abs=1e-12)
        for k in KS:
            assert precision_at_k(ranking, positives, junk, k=k) == pytest.approx(precision_at_k(deleted, positives, k=k), abs=1e-12)


# -- (b) a hand-worked example -------------------------------------------------------------------

def test_hand_worked_example():
    # Query 0: ranking 3 7 1 0 5 9 2 4 6 8, positives {1, 5, 8}, junk {7}.
    #   Without junk: 3 1 0 5 9 2 4 6 8 -> positives at zero-based ranks 1, 3, 8 (n = 3).
    #   AP = 1/3 * [ (0/1 + 1/2)/2 + (1/3 + 2/4)/2 + (2/8 + 3/9)/2 ]
    #      = 1/3 * [ 6/24 + 10/24 + 7/24 ] = 23/72.
    #   Last positive at one-based position 9. P@1: k_q = 1, no positive in the top 1 -> 0.
    #   P@5: k_q = 5, positives at positions 2, 4 -> 2/5. P@10: k_q = min(9, 10) = 9 -> 3/9.
    # Query 1: ranking 2 0 1 3 ..., positives {2}, no junk: AP = (1 + 1/1)/2 = 1;
    #   the only positive is first, so k_q = 1 for every k and P@1 = P@5 = P@10 = 1.
    # Query 2: no positive -> left out of every mean.
    # Means over queries 0 and 1: mAP = (23/72 + 1)/2 = 95/144; mP@1 = 1/2; mP@5 = 7/10; mP@10 = 2/3.
    predictions = np.array([[3, 7, 1, 0, 5, 9, 2, 4, 6, 8],
                            [2, 0, 1, 3, 4, 5, 6, 7, 8, 9],
                            [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]])
    truth = GroundTruth(positives=(np.array([1, 5, 8]), np.array([2]), np.array([], dtype=np.int64)),
                        junk=(np.array([7]), np.array([], dtype=np.int64), np.array([0])))
    result = revisited_metrics(predictions, {"medium": truth})["medium"]
    assert result["map"] == pytest.approx(95 / 144, abs=1e-12)
    assert result["mp@1"] == pytest.approx(1 / 2, abs=1e-12)
    assert result["mp@5"] == pytest.approx(7 / 10, abs=1e-12)
    assert result["mp@10"] == pytest.approx(2 / 3, abs=1e-12)
    assert (result["queries"], result["left_out"], result["incomplete"]) == (2, 1, 0)
    assert average_precision(predictions[0], [1, 5, 8], [7]) == pytest.approx(23 / 72, abs=1e-12)
    assert np.isnan(average_precision(predictions[2], [], [0]))
    assert np.isnan(precision_at_k(predictions[2], [], [0], k=5))


def test_setups_are_scored_separately_and_an_all_empty_setup_is_nan():
    predictions = np.array([[0, 1, 2, 3]])
    setups = {"easy": GroundTruth((np.array([0]),), (np.array([1]),)),
              "hard": GroundTruth((np.array([3]),), (np.array([0]),)),
              "none": GroundTruth((np.array([], dtype=np.int64),))}
    result = revisited_metrics(predictions, setups, ks=(1,))
    assert result["easy"]["map"] == 1.0 and result["easy"]["mp@1"] == 1.0
    # hard: 0 is junk, so the scored list is 1 2 3 and the positive 3 sits at rank 2:
    # AP = (0/2 + 1/3)/2 = 1/6; P@1 = 0.
    assert result["hard"]["map"] == pytest.approx(1 / 6) and result["hard"]["mp@1"] == 0.0
    assert np.isnan(result["none"]["map"]) and result["none"]["left_out"] == 1 and result["none"]["queries"] == 0


# -- (c) truncated rankings, padding, repeats ----------------------------------------------------

def test_truncated_ranking_by_hand():
    # Query 0 of the hand-worked example cut to its top 5: 3 7 1 0 5 -> without junk 3 1 0 5,
    # positives 1 and 5 at ranks 1 and 3, positive 8 not retrieved (it counts as beyond the end).
    #   AP = 1/3 * (6/24 + 10/24) = 2/9 (the full ranking's 23/72 less the missing term 7/72).
    #   P@1: k_q = 1 -> 0. P@5: k_q = 5 -> 2/5. P@10: k_q = 10 -> 2/10 (the full ranking has 3/9).
    ranking, positives, junk = np.array([3, 7, 1, 0, 5]), np.array([1, 5, 8]), np.array([7])
    assert average_precision(ranking, positives, junk) == pytest.approx(2 / 9, abs=1e-12)
    assert [precision_at_k(ranking, positives, junk, k=k) for k in KS] == pytest.approx([0.0, 0.4, 0.2], abs=1e-12)
    result = revisited_metrics(ranking[None], {"m": GroundTruth((positives,), (junk,))})["m"]
    assert result["incomplete"] == 1 and result["map"] == pytest.approx(2 / 9, abs=1e-12)
    # No positive retrieved at all: AP 0 and every P@k 0.
    assert average_precision(np.array([3, 7, 0]), positives, junk) == 0.0
    assert [precision_at_k(np.array([3, 7, 0]), positives, junk, k=k) for k in KS] == [0.0, 0.0, 0.0]


def test_truncated_rankings_against_the_full_ranking():
    """Cut to its top K, AP never exceeds the full ranking's and equals it when every positive is in
    the top K; P@k equals the full ranking's whenever the cut keeps k non-junk results."""
    rng = np.random.default_rng(5)
    exact_ap = exact_precision = 0
    for _ in range(200):
        full = rng.permutation(80)
        positives, junk = _random_query(rng, 80, empty=False)
        cut = int(rng.integers(1, 80))
        top = full[:cut]
        ap_full, ap_top = reference_ap(full, positives, junk), average_precision(top, positives, junk)
        assert ap_top <= ap_full + 1e-12
        if np.isin(positives, top).all():
            assert ap_top == pytest.approx(ap_full, abs=1e-9)
            exact_ap += 1
        kept = len(_scored_list(top, junk))
        for k in KS:
            if k <= kept:
                assert precision_at_k(top, positives, junk, k=k) == pytest.approx(
                    reference_precision(full, positives, junk, k), abs=1e-9)
                exact_precision += 1
    assert exact_ap > 10 and exact_precision > 100  # both branches were exercised


def test_padding_and_repeats_are_ignored():
    rng = np.random.default_rng(8)
    for _ in range(50):
        ranking = rng.permutation(40)
        positives, junk = _random_query(rng, 40, empty=False)
        padded = np.concatenate([ranking[:25], -np.ones(15, dtype=np.int64)])
        repeated = np.concatenate([ranking[:10], ranking[:10], ranking[10:25]])  # repeats count at their first position
        expected = reference_ap(ranking[:25], positives, junk)
        assert average_precision(padded, positives, junk) == pytest.approx(expected, abs=1e-12)
        assert average_precision(repeated, positives, junk) == pytest.approx(expected, abs=1e-12)
    predictions = np.array([[4, -1, -1], [-1, -1, -1]])
    truth = GroundTruth((np.array([4]), np.array([1])))
    result = revisited_metrics(predictions, {"m": truth}, ks=(1,))["m"]
    assert result["map"] == 0.5 and result["mp@1"] == 0.5 and result["incomplete"] == 1


def test_an_id_both_positive_and_junk_counts_as_positive():
    assert average_precision(np.array([5, 1, 2]), np.array([1]), np.array([1, 5])) == 1.0


def test_bad_shapes_are_refused():
    truth = GroundTruth((np.array([0]),))
    with pytest.raises(ValueError, match="Q, K"):
        revisited_metrics(np.array([0, 1]), {"m": truth})
    with pytest.raises(ValueError, match="1 queries but predictions has 2"):
        revisited_metrics(np.zeros((2, 3), dtype=np.int64), {"m": truth})
    with pytest.raises(ValueError, match="negative database id"):
        average_precision(np.array([0, 1]), np.array([-3]))
    with pytest.raises(ValueError, match="k must be"):
        precision_at_k(np.array([0]), np.array([0]), k=0)
