"""Search and Recall@k against an independent brute-force reference; streaming extraction."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from aggzoo.data.retrieval_set import RetrievalSet
from aggzoo.evaluation.extraction import extract_descriptors
from aggzoo.evaluation.index import faiss_available
from aggzoo.evaluation.loop import evaluate_retrieval
from aggzoo.evaluation.metrics import recall_at_k
from aggzoo.evaluation.options import EvaluationOptions, ExtractionOptions, SearchOptions
from aggzoo.evaluation.search import search


def brute_force_recalls(db: np.ndarray, q: np.ndarray, positives, ks) -> dict[int, float]:
    """Reference: full similarity matrix, stable sort (equal scores in database-index order)."""
    sims = q.astype(np.float64) @ db.astype(np.float64).T
    order = np.argsort(-sims, axis=1, kind="stable")
    out = {}
    for k in ks:
        correct = [len(set(order[i, :k]) & set(positives[i].tolist())) > 0 for i in range(len(q))]
        out[k] = sum(correct) / len(q)
    return out


def integer_descriptors(rng, n, d):
    # Small integers: every inner product is exact in float32, so ties are real ties.
    return rng.integers(-2, 3, size=(n, d)).astype(np.float32)


def random_positives(rng, n_q, n_db, empty_every=5):
    return [np.empty(0, np.int64) if i % empty_every == 0
            else np.sort(rng.choice(n_db, rng.integers(1, 6), replace=False))
            for i in range(n_q)]


@pytest.mark.parametrize("backend", ["faiss", "torch"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_recall_matches_brute_force_with_ties(backend, seed, monkeypatch):
    if backend == "torch":
        monkeypatch.setattr("aggzoo.evaluation.search.faiss", None)  # the torch fallback
    elif not faiss_available():
        pytest.skip("faiss not installed")
    rng = np.random.default_rng(seed)
    db, q = integer_descriptors(rng, 300, 6), integer_descriptors(rng, 120, 6)
    positives = random_positives(rng, len(q), len(db))
    ks = (1, 5, 10, 20)
    predictions = search(db, q, 20)
    assert predictions.shape == (120, 20) and predictions.dtype == np.int64
    # Ties are frequent here: the ranking itself equals the stable brute-force one.
    sims = q @ db.T
    np.testing.assert_array_equal(predictions, np.argsort(-sims, axis=1, kind="stable")[:, :20])
    assert recall_at_k(predictions, positives, ks) == brute_force_recalls(db, q, positives, ks)


def test_float_descriptors_and_float16_storage():
    rng = np.random.default_rng(3)
    db = rng.normal(size=(500, 32)).astype(np.float32)
    db /= np.linalg.norm(db, axis=1, keepdims=True)
    q = db[rng.choice(500, 80)] + 0.3 * rng.normal(size=(80, 32)).astype(np.float32)
    positives = random_positives(rng, 80, 500, empty_every=7)
    ks = (1, 5, 10)
    exact = search(db, q, 10)
    assert recall_at_k(exact, positives, ks) == brute_force_recalls(db, q, positives, ks)
    half = search(db.astype(np.float16), q, 10, SearchOptions(index="SQfp16"))
    # float16 rounding (relative 5e-4) may swap near-equal neighbours, nothing more.
    assert (half[:, 0] == exact[:, 0]).mean() > 0.95


def test_recall_closed_form():
    predictions = np.array([[3, 1, 2], [0, 4, 5], [7, 8, 9], [2, 3, 4]])
    positives = [np.array([1]), np.array([0, 9]), np.array([], np.int64), np.array([4])]
    assert recall_at_k(predictions, positives, ks=(1, 2, 3)) == {1: 0.25, 2: 0.5, 3: 0.75}


def test_recall_rejects_k_beyond_predictions():
    with pytest.raises(ValueError, match="Recall@5 needs at least 5"):
        recall_at_k(np.zeros((2, 3), np.int64), [np.array([0]), np.array([1])], ks=(1, 5))
    # ...unless the predictions rank the whole database: then Recall@5 = Recall@3.
    got = recall_at_k(np.array([[2, 0, 1]]), [np.array([1])], ks=(1, 5), num_database=3)
    assert got == {1: 0.0, 5: 1.0}


def test_search_rejects_bad_shapes():
    with pytest.raises(ValueError, match="share D"):
        search(np.zeros((4, 3), np.float32), np.zeros((2, 5), np.float32), 1)
    with pytest.raises(ValueError, match="database size"):
        search(np.zeros((4, 3), np.float32), np.zeros((2, 3), np.float32), 5)


class MeanColour(nn.Module):
    """Descriptor = L2-normalised mean RGB; counts batches and their sizes."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))
        self.batch_sizes: list[int] = []
        self.modes: list[bool] = []
        self.grad_enabled: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.batch_sizes.append(x.shape[0])
        self.modes.append(self.training)
        self.grad_enabled.append(torch.is_grad_enabled())
        return nn.functional.normalize(self.scale * x.mean(dim=(2, 3)) + 3.0, dim=1)


def to_tensor(image: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(image.transpose(2, 0, 1).astype(np.float32) / 255.0)


def write_images(folder: Path, colours) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, c in enumerate(colours):
        path = folder / f"{i:03d}.png"
        Image.new("RGB", (6, 4), tuple(int(v) for v in c)).save(path)
        paths.append(path)
    return paths


def test_extraction_streams_in_order_and_restores_mode(tmp_path):
    rng = np.random.default_rng(0)
    colours = rng.integers(0, 256, size=(11, 3))
    paths = write_images(tmp_path, colours)
    model = MeanColour().train()
    out = extract_descriptors(model, paths, to_tensor, ExtractionOptions(batch_size=4, descriptor_dtype="float16"))
    assert out.shape == (11, 3) and out.dtype == np.float16
    assert model.batch_sizes == [4, 4, 3]           # batches, never the whole set
    assert model.modes == [False] * 3 and model.grad_enabled == [False] * 3
    assert model.training                            # training mode restored
    expected = colours / 255.0 + 3.0
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    np.testing.assert_allclose(out.astype(np.float32), expected, atol=2e-3)


def test_evaluate_retrieval_end_to_end(tmp_path):
    rng = np.random.default_rng(1)
    db_colours = rng.integers(0, 256, size=(30, 3))
    q_colours = np.clip(db_colours[:12] + rng.integers(-4, 5, size=(12, 3)), 0, 255)
    db = write_images(tmp_path / "db", db_colours)
    q = write_images(tmp_path / "q", q_colours)
    positives = tuple(np.array([i], np.int64) for i in range(11)) + (np.empty(0, np.int64),)
    rs = RetrievalSet("colours", tuple(db), tuple(q), positives)
    model = MeanColour()
    result = evaluate_retrieval(model, rs, to_tensor,
                                EvaluationOptions(ks=(1, 5, 50), extraction=ExtractionOptions(batch_size=8)))
    assert result.num_queries == 12 and result.num_database == 30 and result.queries_without_positive == 1
    assert result.predictions.shape == (12, 30)       # k clipped to the database size
    d_db = extract_descriptors(model, db, to_tensor)
    d_q = extract_descriptors(model, q, to_tensor)
    assert result.recalls == brute_force_recalls(d_db, d_q, positives, (1, 5, 50))
    assert result.recalls[50] == pytest.approx(11 / 12)
    assert result.curve.shape == (30,) and np.all(np.diff(result.curve) >= 0)
