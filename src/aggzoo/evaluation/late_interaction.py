"""Multi-vector late interaction: a few instance tokens per image re-rank a single-vector shortlist.

CraterBench-R (Fang, Zhang, Phillips, Luo, "CraterBench-R: Instance-Level Crater Retrieval for Planetary
Scale", CVPR 2026, arXiv:2604.06245; the benchmark is published on the Hugging Face hub, no reference code
was found) keeps ``K`` tokens per image instead of one global vector, training-free ("instance-token
aggregation"): pick ``K`` seed tokens among the patch tokens, assign every patch token to its most
cosine-similar seed, and aggregate each group into one token. Images are compared by late interaction
(ColBERT's MaxSim, Chamfer similarity): ``s(q, d) = sum_i max_j <q_i, d_j>`` over the query's tokens
``q_i`` and the database image's tokens ``d_j``. The paper's two-stage pipeline shortlists with the
single-vector descriptor and re-ranks the shortlist with the tokens; that is :class:`InstanceTokenRerank`.

Choices made here, where the paper leaves room or has a second option:

- Seeds by farthest-point sampling on cosine distance (the paper names top-K attention or FPS; attention
  needs a ViT's CLS attention, FPS works on any backbone). The first seed is the token most similar to
  the image's mean token direction, so the result is deterministic; each next seed is the token whose
  highest cosine to the seeds chosen so far is lowest (ties: the lowest token index).
- Patch tokens are the last feature map flattened (``[B, C, H, W] -> [B, H*W, C]``): ViT patch tokens
  (which :class:`~aggzoo.models.features.Features` carries reshaped to a map) or a CNN's positions.
- Tokens are L2-normalised before seeding, assignment and averaging (cosine space throughout), and each
  group mean is L2-normalised again. With ``K = H*W`` every group is one token, so the score is the plain
  Chamfer similarity of the normalised patch tokens.

Storage: the ``[N, K, C]`` tokens of each split are a float16 ``.npy`` file, memory-mapped
(``2*K*C`` bytes per image); only the shortlisted rows are read when re-ranking.
"""

from __future__ import annotations

import io
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aggzoo.errors import ConfigError
from aggzoo.evaluation.extraction import extract_descriptors
from aggzoo.evaluation.metrics.recall import recall_at_k
from aggzoo.evaluation.options import EvaluationOptions, ExtractionOptions

__all__ = [
    "InstanceTokenRerank",
    "InstanceTokens",
    "assign_to_seeds",
    "extract_instance_tokens",
    "farthest_point_seeds",
    "instance_tokens",
    "late_interaction_scores",
    "patch_tokens",
]


def patch_tokens(maps: Tensor) -> Tensor:
    """The last feature map as tokens: ``[B, C, H, W] -> [B, H*W, C]`` (row-major positions)."""
    return maps.flatten(2).transpose(1, 2)


def farthest_point_seeds(tokens: Tensor, k: int) -> Tensor:
    """``K`` seed indices per image by farthest-point sampling on cosine distance.

    Args:
        tokens: ``[B, T, C]``, L2-normalised.
        k: ``K <= T``.

    Returns:
        ``[B, K]`` token indices, in the order they were picked (distinct while distinct tokens remain).
    """
    b, t, _ = tokens.shape
    rows = torch.arange(b, device=tokens.device)
    mean = F.normalize(tokens.mean(dim=1), dim=-1)                           # [B, C]
    first = torch.einsum("btc,bc->bt", tokens, mean).argmax(dim=1)           # [B]
    seeds = [first]
    # One [B, T] row of cosines per new seed, never the [B, T, T] matrix (T = 1369 for a 37 x 37 ViT grid).
    closest = torch.einsum("btc,bc->bt", tokens, tokens[rows, first])        # best cosine to a seed so far
    chosen = torch.zeros(b, t, dtype=torch.bool, device=tokens.device)
    chosen[rows, first] = True
    for _ in range(1, k):
        # A chosen token never comes back while another remains (duplicates of a seed still can).
        nxt = closest.masked_fill(chosen, float("inf")).argmin(dim=1)
        seeds.append(nxt)
        chosen[rows, nxt] = True
        closest = torch.maximum(closest, torch.einsum("btc,bc->bt", tokens, tokens[rows, nxt]))
    return torch.stack(seeds, dim=1)


def assign_to_seeds(tokens: Tensor, seeds: Tensor) -> Tensor:
    """Group of every token: the seed of highest cosine (ties: the earlier seed); a seed is its own group.

    Args:
        tokens: ``[B, T, C]``, L2-normalised.
        seeds: ``[B, K]`` token indices.

    Returns:
        ``[B, T]`` group ids in ``[0, K)``.
    """
    seed_tokens = tokens.gather(1, seeds[..., None].expand(-1, -1, tokens.shape[-1]))   # [B, K, C]
    groups = (tokens @ seed_tokens.transpose(1, 2)).argmax(dim=2)                        # [B, T]
    # A token identical to two seeds would leave the second seed's group empty: pin seeds to their own.
    groups.scatter_(1, seeds, torch.arange(seeds.shape[1], device=seeds.device).expand_as(seeds))
    return groups


def instance_tokens(tokens: Tensor, k: int) -> Tensor:
    """CraterBench-R's instance-token aggregation (training-free): ``[B, T, C] -> [B, K, C]`` unit tokens.

    Seeds by :func:`farthest_point_seeds`, groups by :func:`assign_to_seeds`, each group's mean of the
    normalised tokens, L2-normalised; token ``j`` is the group of the ``j``-th seed.
    """
    b, t, c = tokens.shape
    if not 1 <= k <= t:
        raise ConfigError(f"evaluation.rerank.tokens={k}: the backbone gives {t} patch tokens per image at this input "
                          f"size; choose 1 <= evaluation.rerank.tokens <= {t}")
    unit = F.normalize(tokens.float(), dim=-1)
    groups = assign_to_seeds(unit, farthest_point_seeds(unit, k))
    sums = unit.new_zeros(b, k, c).scatter_add_(1, groups[..., None].expand(b, t, c), unit)
    return F.normalize(sums, dim=-1)


class InstanceTokens(nn.Module):
    """``images [B, 3, H, W] -> [B, K*C]``: a model's instance tokens, flattened so that the one
    extraction loop (:func:`~aggzoo.evaluation.extraction.extract_descriptors`) stores them.

    Args:
        model: has ``forward_features(images) -> Features`` (a :class:`~aggzoo.models.vpr_model.VPRModel`).
        tokens: ``K``.
    """

    def __init__(self, model: nn.Module, tokens: int) -> None:
        super().__init__()
        if not callable(getattr(model, "forward_features", None)):
            raise ConfigError(f"evaluation.rerank.method=instance_tokens needs the backbone's patch tokens, but "
                              f"{type(model).__name__} has no forward_features; evaluate a plain backbone + head "
                              "model (evaluation.test_time.scales=[1.0])")
        self.model = model
        self.tokens = int(tokens)
        # Extraction restores the wrapper's mode afterwards, through model too: start in the model's own.
        self.train(model.training)

    def forward(self, images: Tensor) -> Tensor:
        return instance_tokens(patch_tokens(self.model.forward_features(images).last), self.tokens).flatten(1)


def extract_instance_tokens(model: nn.Module, paths: Sequence[Any], transform: Callable[[np.ndarray], Tensor],
                            options: ExtractionOptions = ExtractionOptions(), *, tokens: int = 16,
                            out_path: str | Path | None = None, boxes: Sequence[Any] | None = None) -> np.ndarray:
    """``[N, K, C]`` float16 instance tokens of ``paths`` (a memory-mapped ``.npy`` at ``out_path``), extracted
    with ``options`` (batch size, workers, device, progress; stored float16 whatever ``descriptor_dtype`` says)."""
    options = replace(options, descriptor_dtype="float16")
    flat = extract_descriptors(InstanceTokens(model, tokens), paths, transform, options, out_path=out_path,
                               desc="instance tokens", boxes=boxes)
    shape = (len(flat), tokens, flat.shape[1] // tokens)
    if out_path is None:
        return flat.reshape(shape)
    del flat
    _set_npy_shape(Path(out_path), shape)
    return np.load(out_path, mmap_mode="r")


def _set_npy_shape(path: Path, shape: tuple[int, ...]) -> None:
    """Give the ``.npy`` file at ``path`` (C order) the header of ``shape`` (same element count), in place.

    The one extraction loop writes ``[N, K*C]`` rows; the same bytes read as ``[N, K, C]``. A version-1.0
    header is padded to 64 bytes, so the new one has the old one's length unless the shape's text grows
    past that padding (then the file keeps its flat shape: refused loudly rather than rewritten).
    """
    with path.open("r+b") as handle:
        version = np.lib.format.read_magic(handle)
        old_shape, fortran, dtype = np.lib.format.read_array_header_1_0(handle)
        if version != (1, 0) or fortran or int(np.prod(old_shape)) != int(np.prod(shape)):
            raise ValueError(f"{path}: expected a C-order version-1.0 .npy of {int(np.prod(shape))} values")
        offset = handle.tell()
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            header, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape})
        if header.tell() != offset:
            raise ValueError(f"{path}: the header of shape {shape} does not fit in place of {old_shape}")
        handle.seek(0)
        handle.write(header.getvalue())


def late_interaction_scores(queries: Tensor, database: Tensor) -> Tensor:
    """Late-interaction (Chamfer / MaxSim) scores ``sum_i max_j <q_i, d_j>``.

    Args:
        queries: ``[b, Kq, C]`` tokens of ``b`` queries.
        database: ``[b, M, K, C]`` tokens of each query's ``M`` candidates.

    Returns:
        ``[b, M]``.
    """
    return torch.einsum("bic,bmjc->bmij", queries, database).amax(dim=3).sum(dim=2)


@dataclass(frozen=True)
class InstanceTokenRerank:
    """Re-rank the single-vector top-``top_m`` by the late-interaction score of ``tokens`` instance tokens.

    ``evaluation.rerank.method=instance_tokens evaluation.rerank.k=<top_m> evaluation.rerank.tokens=<K>``. Candidates past
    ``top_m`` keep their single-vector order; equal scores keep the shortlist order.
    """

    top_m: int = 100
    tokens: int = 16
    query_chunk: int = 64
    #: the search must return the images too: tokens are extracted from them (see :meth:`bind`)
    needs_images = True
    #: where evaluate_benchmarks records the bound re-ranker's figures in each result's extras
    stats_key = "instance_tokens"

    def __post_init__(self) -> None:
        if self.top_m < 1:
            raise ConfigError(f"evaluation.rerank.k={self.top_m}: the shortlist re-ranked by instance tokens must "
                              "hold at least 1 candidate (e.g. evaluation.rerank.k=100)")
        if self.tokens < 1:
            raise ConfigError(f"evaluation.rerank.tokens={self.tokens}: keep at least 1 instance token per image "
                              "(e.g. evaluation.rerank.tokens=16)")

    def rerank(self, database_tokens: np.ndarray, query_tokens: np.ndarray, predictions: np.ndarray,
               device: torch.device | str | None = None) -> np.ndarray:
        """``predictions [Q, K_pred]`` (single-vector order, ``-1`` pads last) re-ranked; same shape.

        Args:
            database_tokens: ``[N, K, C]`` (float16, may be memory-mapped: only shortlisted rows are read).
            query_tokens: ``[Q, K, C]``.
        """
        predictions = np.asarray(predictions)
        m = min(self.top_m, predictions.shape[1])
        out = predictions.copy()
        for start in range(0, len(predictions), self.query_chunk):
            ids = predictions[start:start + self.query_chunk, :m]
            valid = ids >= 0
            rows, inverse = np.unique(np.where(valid, ids, 0), return_inverse=True)
            cand = torch.from_numpy(np.asarray(database_tokens[rows], dtype=np.float32))[
                torch.from_numpy(inverse.reshape(ids.shape))].to(device)     # [b, M, K, C]
            q = torch.from_numpy(np.asarray(query_tokens[start:start + self.query_chunk], dtype=np.float32)).to(device)
            scores = late_interaction_scores(q, cand).cpu()
            scores[torch.from_numpy(~valid)] = -torch.inf
            order = torch.argsort(scores, dim=1, descending=True, stable=True).numpy()
            out[start:start + self.query_chunk, :m] = np.take_along_axis(ids, order, axis=1)
        return out

    def bind(self, model: nn.Module, retrieval_set: Any, transform: Callable[[np.ndarray], Tensor],
             options: EvaluationOptions = EvaluationOptions()) -> _BoundRerank:
        """The re-ranker of one benchmark, called as :class:`~aggzoo.evaluation.postprocess.SuperGlobalRerank`
        is (``(database, queries, predictions, device) -> predictions``): it extracts both splits' tokens
        (float16 files ``<name>_{database,queries}_tokens.npy`` under ``options.search.store_dir``, default a
        temporary folder removed afterwards), re-ranks, and records its figures in ``stats``."""
        return _BoundRerank(self, model, retrieval_set, transform, options)


class _BoundRerank:
    def __init__(self, spec: InstanceTokenRerank, model: nn.Module, retrieval_set: Any, transform: Any,
                 options: EvaluationOptions) -> None:
        self.spec, self.model, self.set, self.transform = spec, model, retrieval_set, transform
        self.store_dir, self.ks, self.extraction = options.search.store_dir, tuple(options.ks), options.extraction
        self.top_m = spec.top_m
        self.stats: dict[str, Any] = {}

    def __call__(self, database: np.ndarray, queries: np.ndarray, predictions: np.ndarray,
                 device: torch.device | str | None = None) -> np.ndarray:
        name = self.set.name
        with tempfile.TemporaryDirectory(prefix="aggzoo-tokens-") as tmp:
            folder = Path(self.store_dir if self.store_dir is not None else tmp)
            folder.mkdir(parents=True, exist_ok=True)
            start = time.perf_counter()
            splits = {}
            boxes = self.set.query_boxes
            for split, paths, split_boxes in (("database", self.set.database_paths, None),
                                              ("queries", self.set.query_paths, boxes)):
                splits[split] = extract_instance_tokens(
                    self.model, paths, self.transform, self.extraction, tokens=self.spec.tokens,
                    out_path=folder / f"{name}_{split}_tokens.npy", boxes=split_boxes)
            extracted = time.perf_counter()
            reranked = self.spec.rerank(splits["database"], splits["queries"], predictions, device=device)
            done = time.perf_counter()
            _, k, c = splits["database"].shape
            del splits  # close the memory maps before the temporary folder goes
        ks = [k_ for k_ in self.ks if k_ <= predictions.shape[1]]
        self.stats = {
            "tokens": k, "token_dim": c, "shortlist": min(self.top_m, predictions.shape[1]),
            "token_bytes_per_image": 2 * k * c,
            "token_extraction_seconds": round(extracted - start, 3),
            "rerank_ms_per_query": round(1000 * (done - extracted) / max(1, len(predictions)), 4),
            "recalls_before_rerank": {str(k_): v for k_, v in recall_at_k(
                predictions, self.set.positives, ks, num_database=self.set.num_database).items()},
        }
        return reranked
