"""Second stage by local matching: re-order a global shortlist by mutual nearest neighbours (SelaVPR, FoL).

F. Lu et al., "Towards Seamless Adaptation of Pre-trained Models for Visual Place Recognition"
(SelaVPR), ICLR 2024, arXiv:2402.14505. Original code: Lu-Feng/SelaVPR ``local_matching.py``,
``test.py`` (MIT); re-implemented from them.

Shortlist in, re-ordered shortlist out, like :class:`aggzoo.evaluation.postprocess.SuperGlobalRerank`:
the first stage is the usual global search (:func:`aggzoo.evaluation.search.search`); for each
query, each of its ``top_k`` candidates is scored by the number of mutual nearest neighbours between
the query's and the candidate's dense local features (dot products of unit vectors; feature ``i`` of
the query and ``j`` of the candidate match when each is the other's best), and the shortlist is
sorted by that count, most first. The global score is not used in the second stage (as upstream).

FoL (Wang et al., AAAI 2025, arXiv:2504.09881; chenshunpeng/FoL ``test_FoL.py``, Apache-2.0, read for the
rule only) scores the same way with two changes (:func:`fol_rerank`, ``evaluation.rerank.method=fol``): a
mutual pair counts only when its cosine exceeds 0.7, and the local features are those of the reliable
regions (:meth:`aggzoo.models.heads.fol.FoL.local_features`: ``[L, 128]`` rows, zero-padded; zero rows never
reach the threshold, so the padding changes no count), kept in float32 as upstream (the threshold is
sensitive to fp16 rounding). Its shortlist is the top ``max(recall_values)`` = 100.

Differences from upstream, both on ties or degenerate cases only: candidates with equal counts keep
their first-stage order (upstream reverses a numpy quicksort, whose tie order is arbitrary), and a
candidate with exactly one mutual match scores 1 (upstream's ``squeeze`` turns that case into 0).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader

from aggzoo.data.progress import progress_bar
from aggzoo.data.retrieval_set import ImageListDataset, RetrievalSet
from aggzoo.data.workers import loader_workers
from aggzoo.errors import ConfigError
from aggzoo.evaluation.extraction import model_device, open_store
from aggzoo.evaluation.loop import Stages, evaluate_retrieval
from aggzoo.evaluation.metrics.recall import recall_at_k
from aggzoo.evaluation.options import EvaluationOptions, ExtractionOptions
from aggzoo.evaluation.result import RetrievalResult
from aggzoo.models.modes import evaluating

__all__ = ["FOL_MIN_SIMILARITY", "MutualNNRerank", "evaluate_with_local_rerank", "extract_local_features",
           "fol_rerank", "mutual_nn_counts"]

#: FoL's match threshold: a mutual pair counts when its cosine exceeds it (``test_FoL.py``: ``T2=0.7``)
FOL_MIN_SIMILARITY = 0.7


def mutual_nn_counts(query: Tensor, candidates: Tensor, min_similarity: float | None = None) -> Tensor:
    """``query: [L, C]``, ``candidates: [K, M, C]`` (unit vectors) -> ``[K]`` mutual-nearest-neighbour counts;
    with ``min_similarity``, only the pairs whose dot product exceeds it (FoL: 0.7)."""
    sims = candidates.float() @ query.float().T              # [K, M, L]
    best_in_candidate = sims.argmax(dim=1)                   # [K, L]: for each query feature
    best_in_query = sims.argmax(dim=2)                       # [K, M]: for each candidate feature
    back = best_in_query.gather(1, best_in_candidate)        # [K, L]
    mutual = back == torch.arange(query.shape[0], device=query.device)
    if min_similarity is not None:
        mutual &= sims.gather(1, best_in_candidate.unsqueeze(1)).squeeze(1) > min_similarity
    return mutual.sum(dim=1)


@dataclass(frozen=True)
class MutualNNRerank:
    """Re-order the first ``top_k`` candidates of each query by :func:`mutual_nn_counts` (SelaVPR: 100;
    its README: 20 gives about the same recall at a fifth of the time)."""

    top_k: int = 100
    #: a mutual pair counts only above this cosine (FoL: 0.7); ``None``: every mutual pair (SelaVPR)
    min_similarity: float | None = None
    #: how the local features are stored between extraction and matching (``"float16"``: SelaVPR's 0.9 MB per image)
    local_dtype: str = "float16"
    #: what ``stats["method"]`` and the error messages call it (``evaluation.rerank.method``)
    name: str = "mutual_nn"
    #: the search must return the images too: local features are extracted from them (see :meth:`bind`)
    needs_images = True
    #: where evaluate_benchmarks records the bound re-ranker's figures in each result's extras
    stats_key = "rerank"

    def __post_init__(self) -> None:
        if self.top_k < 1:
            raise ConfigError(f"evaluation.rerank.k={self.top_k}: the shortlist re-ranked by mutual nearest neighbours "
                              "must hold at least 1 candidate (SelaVPR, FoL: 100)")
        if self.local_dtype not in ("float16", "float32"):
            raise ConfigError(f"local features are stored as float16 or float32, got {self.local_dtype!r}")

    @property
    def top_m(self) -> int:
        """The shortlist the first stage must return (the name every re-ranker gives it)."""
        return self.top_k

    def bind(self, model: nn.Module, retrieval_set: RetrievalSet, transform: Callable[[np.ndarray], Tensor],
             options: EvaluationOptions = EvaluationOptions()) -> _BoundLocalRerank:
        """The re-ranker of one benchmark, called as the search calls any re-ranker
        (``(database, queries, predictions, device) -> predictions``): it extracts both splits' local
        features (fp16, memory-mapped under ``options.search.store_dir`` when given), re-orders the shortlist and records
        its settings, time and the first stage's recalls in ``stats``."""
        if not callable(getattr(getattr(model, "head", None), "local_features", None)):
            raise ConfigError(f"evaluation.rerank.method={self.name} re-ranks by local features, which "
                              f"{type(getattr(model, 'head', model)).__name__} does not give (SelaVPR's and FoL's heads do: "
                              "head=selavpr, head=fol); use evaluation.rerank.method=instance_tokens or superglobal for "
                              "this model")
        return _BoundLocalRerank(self, model, retrieval_set, transform, options)

    def __call__(self, query_local: np.ndarray, database_local: np.ndarray, predictions: np.ndarray, *,
                 device: torch.device | str = "cpu") -> np.ndarray:
        """``query_local: [Q, L, C]``, ``database_local: [N, M, C]``, ``predictions: [Q, K]`` ranked indices
        -> the same shape, each row's first ``min(top_k, K)`` entries re-ordered (the rest unchanged)."""
        out = np.array(predictions, copy=True)
        k = min(self.top_k, predictions.shape[1])
        for q in range(predictions.shape[0]):
            shortlist = predictions[q, :k]
            query = torch.as_tensor(np.asarray(query_local[q]), device=device)
            candidates = torch.as_tensor(np.asarray(database_local[shortlist]), device=device)
            counts = mutual_nn_counts(query, candidates, self.min_similarity).cpu().numpy()
            out[q, :k] = shortlist[np.argsort(-counts, kind="stable")]
        return out


class _BoundLocalRerank:
    def __init__(self, spec: MutualNNRerank, model: nn.Module, retrieval_set: RetrievalSet, transform: Any,
                 options: EvaluationOptions) -> None:
        self.spec, self.model, self.set, self.transform = spec, model, retrieval_set, transform
        self.store_dir, self.ks = options.search.store_dir, tuple(options.ks)
        self.extraction = options.extraction
        self.top_m = spec.top_k
        self.stats: dict[str, Any] = {}

    def __call__(self, database: np.ndarray, queries: np.ndarray, predictions: np.ndarray,
                 device: torch.device | str | None = None) -> np.ndarray:
        start = time.perf_counter()
        name, folder = self.set.name, Path(self.store_dir) if self.store_dir is not None else None
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
        local = {split: extract_local_features(self.model, paths, self.transform, self.extraction,
                                               out_path=folder / f"{name}_{split}_local.npy" if folder else None,
                                               dtype=self.spec.local_dtype)
                 for split, paths in (("database", self.set.database_paths), ("queries", self.set.query_paths))}
        reranked = self.spec(local["queries"], local["database"], predictions, device=device or "cpu")
        ks = [k for k in self.ks if k <= predictions.shape[1]]
        self.stats = {"method": self.spec.name, "top_k": self.spec.top_k, "min_similarity": self.spec.min_similarity,
                      "local_features": list(local["database"].shape[1:]),
                      "seconds": round(time.perf_counter() - start, 3),
                      "first_stage_recalls": {str(k): v for k, v in recall_at_k(
                          predictions, self.set.positives, ks, num_database=self.set.num_database).items()}}
        return reranked


def extract_local_features(
    model: nn.Module, paths: Sequence[str | Any], transform: Callable[[np.ndarray], Tensor],
    options: ExtractionOptions = ExtractionOptions(batch_size=16), *, out_path: str | Path | None = None,
    dtype: str = "float16",
) -> np.ndarray:
    """``[N, L, C]`` local features (``model.head.local_features``: a ``[B, H, W, C]`` grid flattened row-major,
    or ``[B, L, C]`` rows as FoL gives them) of ``N`` images, one batch at a time (``options``: batch size,
    workers, device, progress), in ``dtype`` (float16: 0.9 MB per image at SelaVPR's 3721 x 128), in RAM or
    memory-mapped at ``out_path``. ``model`` is a VPRModel whose head has ``local_features``."""
    head = getattr(model, "head", None)
    if not callable(getattr(head, "local_features", None)):
        raise ValueError(f"local re-ranking needs a head with local_features() (SelaVPR), got {type(head).__name__}")
    device = options.torch_device or model_device(model)
    dtype = np.dtype(dtype)
    loader = DataLoader(ImageListDataset(paths, transform), batch_size=int(options.batch_size), shuffle=False,
                        num_workers=loader_workers(options.num_workers, len(paths)))
    out: np.ndarray | None = None
    bar = progress_bar(loader, options.progress, "local features", unit="batch")
    with evaluating(model), torch.inference_mode(), bar as batches:
        for images, indices in batches:
            local = head.local_features(model.backbone(images.to(device)))
            local = local.flatten(1, 2) if local.ndim == 4 else local  # [B, L, C]
            if out is None:
                shape = (len(paths), *local.shape[1:])
                out = np.empty(shape, dtype=dtype) if out_path is None else open_store(out_path, dtype, shape)
            out[indices.numpy()] = local.float().cpu().numpy().astype(dtype, copy=False)
    if out is None:
        raise ValueError("no images to extract local features from (empty path list)")
    return out


def fol_rerank(top_k: int = 100) -> MutualNNRerank:
    """FoL's re-ranking: the top ``top_k`` (100) by mutual nearest neighbours above cosine 0.7 of the reliable
    regions' local features, stored in float32 (``evaluation.rerank.method=fol``)."""
    return MutualNNRerank(top_k=top_k, min_similarity=FOL_MIN_SIMILARITY, local_dtype="float32", name="fol")


def evaluate_with_local_rerank(
    model: nn.Module, retrieval_set: RetrievalSet, transform: Callable[[np.ndarray], Tensor],
    options: EvaluationOptions = EvaluationOptions(), rerank: MutualNNRerank = MutualNNRerank(),
) -> RetrievalResult:
    """Global search for a ``rerank.top_k`` shortlist, then :class:`MutualNNRerank` of it (the search's
    re-ranking stage, as ``eval.py evaluation.rerank.method=mutual_nn`` runs it); Recall@k of the re-ordered
    lists, with the re-ranking's settings, time and the first stage's recalls in ``extras["rerank"]``."""
    bound = rerank.bind(model, retrieval_set, transform, options)
    result = evaluate_retrieval(model, retrieval_set, transform, options, Stages(rerank=bound))
    result.extras[rerank.stats_key] = bound.stats
    return result
