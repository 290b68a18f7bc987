"""The metric-learning evaluation: every image a query against the others (itself removed by index), Recall@k,
MAP@R and R-Precision, against a hand-worked example and against pytorch-metric-learning's ``AccuracyCalculator``
(a second implementation, with its own FAISS k-NN) on random embeddings."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

from aggzoo.data.class_labelled import ClassLabelledImages
from aggzoo.data.class_retrieval import class_positives, class_retrieval_set
from aggzoo.data.retrieval_set import RetrievalSet
from aggzoo.evaluation.extraction import extract_descriptors
from aggzoo.evaluation.loop import Stages, evaluate_retrieval, search_depth
from aggzoo.evaluation.metrics.map_at_r import hits_in_first_r, map_at_r_metrics
from aggzoo.evaluation.metrics.recall import recall_at_k
from aggzoo.evaluation.options import EvaluationOptions, SearchOptions
from aggzoo.evaluation.postprocess import PCAWhitening
from aggzoo.evaluation.report import format_table
from aggzoo.evaluation.result import result_from_predictions
from aggzoo.evaluation.search import search, search_without_self

KS = (1, 2, 4, 8)


class RecallCalculator(AccuracyCalculator):
    """pytorch-metric-learning's calculator with Recall@k added the way its documentation adds a metric: from its
    own k-NN labels, over its non-lone queries."""

    def requires_knn(self):
        return super().requires_knn() + [f"recall_at_{k}" for k in KS]

    def get_function_dict(self, include=(), exclude=()):
        functions = super().get_function_dict(include, exclude)
        for k in KS:
            functions[f"recall_at_{k}"] = self._recall(k)
        return functions

    @staticmethod
    def _recall(k):
        def calculate(knn_labels, query_labels, not_lone_query_mask, **kwargs):
            hit = (knn_labels[:, :k] == query_labels[:, None]).any(dim=1)
            return float(hit[not_lone_query_mask].double().mean())
        return calculate


def _pml(query, query_labels, reference, reference_labels, ref_includes_query):
    calculator = RecallCalculator(include=("precision_at_1", "r_precision", "mean_average_precision_at_r"), k=None)
    return calculator.get_accuracy(torch.from_numpy(query), torch.from_numpy(query_labels),
                                   torch.from_numpy(reference), torch.from_numpy(reference_labels),
                                   ref_includes_query=ref_includes_query)


def _embeddings(rng, n, dim=12):
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _clustered(rng, labels, dim=12):
    """Unit embeddings near a random centre per class, so the metrics land mid-range (not near 0 or 1)."""
    classes, index = np.unique(labels, return_inverse=True)
    centres = rng.standard_normal((len(classes), dim))
    x = (centres[index] + 1.2 * rng.standard_normal((len(labels), dim))).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_hand_worked_example() -> None:
    # query 0: R = 3 positives {1, 4, 7}; first 3 results 4 (hit), 2 (miss), 1 (hit): P(1) = 1, P(3) = 2/3
    #          -> MAP@R = (1 + 2/3) / 3 = 5/9, R-Precision = 2/3
    # query 1: R = 1 positive {0}, first result 3 (miss) -> 0 and 0 (its positive at rank 2 does not count)
    # query 2: no positive -> left out
    predictions = np.array([[4, 2, 1, 9, 7], [3, 0, 5, 6, 8], [1, 2, 3, 4, 5]])
    positives = (np.array([1, 4, 7]), np.array([0]), np.array([], dtype=np.int64))
    values = map_at_r_metrics(predictions, positives)
    assert values["map_at_r"] == pytest.approx((5 / 9 + 0) / 2, abs=1e-12)
    assert values["r_precision"] == pytest.approx((2 / 3 + 0) / 2, abs=1e-12)
    assert (values["queries"], values["left_out"], values["incomplete"]) == (2, 1, 0)
    assert hits_in_first_r(predictions[0], positives[0]).tolist() == [True, False, True]


def test_short_rankings_and_padding_count_as_misses() -> None:
    # R = 3 but only 2 results, the second padding: P(1) = 1 -> MAP@R = 1/3, RP = 1/3, and the query is incomplete
    values = map_at_r_metrics(np.array([[5, -1]]), (np.array([5, 6, 7]),))
    assert values["map_at_r"] == pytest.approx(1 / 3) and values["r_precision"] == pytest.approx(1 / 3)
    assert values["incomplete"] == 1
    perfect = map_at_r_metrics(np.array([[7, 6, 5, 0]]), (np.array([5, 6, 7]),))
    assert perfect["map_at_r"] == 1.0 and perfect["r_precision"] == 1.0


def test_search_without_self_removes_the_query_by_index_not_by_score() -> None:
    rng = np.random.default_rng(0)
    database = _embeddings(rng, 40)
    database[7] = database[3]  # a duplicate: rows 3 and 7 score the same against each other as against themselves
    predictions = search_without_self(database, 5)
    scores = database.astype(np.float64) @ database.astype(np.float64).T
    for q in range(len(database)):
        others = np.array([i for i in np.lexsort((np.arange(40), -scores[q])) if i != q])
        assert predictions[q].tolist() == others[:5].tolist()
    assert predictions[3, 0] == 7 and predictions[7, 0] == 3   # the duplicate stays, first
    with pytest.raises(ValueError, match="without the query"):
        search_without_self(database, 40)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_one_set_equals_pytorch_metric_learning(seed: int) -> None:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 30, 400)
    labels[:3] = [1000, 1001, 1002]  # three classes of one image: lone queries, left out of every metric
    embeddings = _clustered(rng, labels)
    positives = class_positives(labels, labels, exclude_self=True)
    depth = max(max(len(p) for p in positives), max(KS))
    predictions = search_without_self(embeddings, depth)
    ours = map_at_r_metrics(predictions, positives)
    theirs = _pml(embeddings, labels, embeddings, labels, ref_includes_query=True)
    assert ours["left_out"] == 3 and 0.05 < ours["map_at_r"] < 0.95
    assert ours["map_at_r"] == pytest.approx(theirs["mean_average_precision_at_r"], abs=1e-6)
    assert ours["r_precision"] == pytest.approx(theirs["r_precision"], abs=1e-6)
    kept = np.flatnonzero([len(p) > 0 for p in positives])
    recalls = recall_at_k(predictions[kept], [positives[q] for q in kept], KS)
    for k in KS:
        assert recalls[k] == pytest.approx(theirs[f"recall_at_{k}"], abs=1e-6)
    assert recalls[1] == pytest.approx(theirs["precision_at_1"], abs=1e-6)


def test_query_against_gallery_equals_pytorch_metric_learning() -> None:
    rng = np.random.default_rng(5)
    gallery_labels, query_labels = rng.integers(0, 25, 300), rng.integers(0, 25, 120)
    gallery, queries = _clustered(rng, gallery_labels), _clustered(rng, query_labels)
    positives = class_positives(query_labels, gallery_labels)
    predictions = search(gallery, queries, max(max(len(p) for p in positives), max(KS)))
    ours = map_at_r_metrics(predictions, positives)
    theirs = _pml(queries, query_labels, gallery, gallery_labels, ref_includes_query=False)
    assert ours["map_at_r"] == pytest.approx(theirs["mean_average_precision_at_r"], abs=1e-6)
    assert ours["r_precision"] == pytest.approx(theirs["r_precision"], abs=1e-6)
    recalls = recall_at_k(predictions, positives, KS)
    for k in KS:
        assert recalls[k] == pytest.approx(theirs[f"recall_at_{k}"], abs=1e-6)


def _class_set(labels, tmp_path) -> RetrievalSet:
    images = ClassLabelledImages("toy", tuple(tmp_path / f"{i}.jpg" for i in range(len(labels))), np.asarray(labels))
    return class_retrieval_set(images)


def test_the_search_is_deep_enough_for_map_at_r(tmp_path) -> None:
    labels = [0] * 12 + [1] * 3 + [2] * 2
    benchmark = _class_set(labels, tmp_path)
    assert benchmark.num_candidates == 16
    assert search_depth(benchmark, EvaluationOptions(ks=(1, 2))) == 11     # R of class 0
    assert search_depth(benchmark, EvaluationOptions(ks=(1, 50))) == 16    # capped: the query is no candidate


def test_result_and_table_report_recall_map_at_r_and_r_precision(tmp_path) -> None:
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 6, 60)
    benchmark = _class_set(labels, tmp_path)
    embeddings = _clustered(rng, labels)
    predictions = search_without_self(embeddings, search_depth(benchmark, EvaluationOptions(ks=(1, 2, 4))))
    result = result_from_predictions(benchmark, predictions, (1, 2, 4))
    theirs = _pml(embeddings, labels, embeddings, labels, ref_includes_query=True)
    assert result.metrics["all/MAP@R"] == pytest.approx(theirs["mean_average_precision_at_r"], abs=1e-6)
    assert result.metrics["all/R-Precision"] == pytest.approx(theirs["r_precision"], abs=1e-6)
    assert result.recalls[1] == pytest.approx(theirs["precision_at_1"], abs=1e-6)
    assert result.extras["metric_queries"]["all"] == {"queries": 60, "left_out": 0, "incomplete": 0}
    table = format_table([result])
    recall_header, metric_header = (line for line in table.splitlines() if line.startswith("benchmark"))
    assert "R@4 (%)" in recall_header
    assert metric_header.split()[-4:] == ["MAP@R", "(%)", "R-Precision", "(%)"]
    row = next(line for line in table.splitlines() if line.split()[:2] == ["toy", "all"])
    assert row.split()[-2:] == [f"{100 * result.metrics['all/MAP@R']:.2f}", f"{100 * result.metrics['all/R-Precision']:.2f}"]


class MeanColour(torch.nn.Module):
    """Descriptor = L2-normalised mean RGB (+3, so colours stay apart); counts the images it sees."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(()))
        self.images_seen = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.images_seen += x.shape[0]
        return torch.nn.functional.normalize(self.scale * x.mean(dim=(2, 3)) + 3.0, dim=1)


def _to_tensor(image: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(image.transpose(2, 0, 1).astype(np.float32) / 255.0)


@pytest.mark.parametrize("whiten, store", [(False, "ram"), (True, "ram"), (False, "disk")])
def test_evaluate_retrieval_searches_a_class_set_once_without_self(tmp_path, whiten: bool, store: str) -> None:
    rng = np.random.default_rng(4)
    labels = np.repeat(np.arange(6), 4)
    centres = rng.integers(40, 200, (6, 3))
    paths = []
    for i, label in enumerate(labels):  # each class a colour, its images that colour plus noise
        colour = np.clip(centres[label] + rng.integers(-30, 31, 3), 0, 255)
        paths.append(tmp_path / f"{i}.png")
        Image.new("RGB", (6, 4), tuple(int(v) for v in colour)).save(paths[-1])
    images = ClassLabelledImages("colours", tuple(paths), labels)
    benchmark = class_retrieval_set(images)
    whitening = PCAWhitening.fit(rng.standard_normal((50, 3)).astype(np.float32), 3) if whiten else None
    options = EvaluationOptions(ks=(1, 2, 4), search=SearchOptions(refine_store=store, refine=5 if store == "disk" else None,
                                                                   index="Flat" if store == "ram" else "HNSW32"))
    model = MeanColour()
    result = evaluate_retrieval(model, benchmark, _to_tensor, options, Stages(whitening=whitening))
    assert model.images_seen == 24                              # one extraction: the queries are the database
    descriptors = extract_descriptors(model, paths, _to_tensor)
    if whitening is not None:
        descriptors = whitening(descriptors)
    scores = descriptors.astype(np.float64) @ descriptors.astype(np.float64).T
    np.fill_diagonal(scores, -np.inf)                           # never itself
    ranking = np.argsort(-scores, axis=1, kind="stable")[:, :4]  # depth: max(k, R) = 4
    assert np.array_equal(result.predictions, ranking)
    expected = map_at_r_metrics(ranking, benchmark.positives)
    assert result.metrics["all/MAP@R"] == pytest.approx(expected["map_at_r"], abs=1e-12)
    assert result.recalls == recall_at_k(ranking, benchmark.positives, (1, 2, 4))
    assert 0 < expected["map_at_r"] < 1
