"""The evaluation of one benchmark: extract -> (post-process) -> index and search -> (re-rank) -> metrics.

Each stage reads its own options object (:mod:`aggzoo.evaluation.options`); the fitted or bound parts of an
evaluation (a PCA-whitening, a re-ranker bound to the benchmark's images, an extractor sharded across ranks)
come in as :class:`Stages`. :func:`aggzoo.evaluation.benchmarks.evaluate_benchmarks` runs this for every
benchmark of a job and writes the report.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from aggzoo.data.retrieval_set import RetrievalSet
from aggzoo.errors import ConfigError
from aggzoo.evaluation.batch_dependence import batch_dependence_record
from aggzoo.evaluation.binary_codes import BinaryCodes
from aggzoo.evaluation.descriptor_cache import DescriptorCache
from aggzoo.evaluation.extraction import extract_descriptors, model_device, open_store
from aggzoo.evaluation.index import binary_refine_message, is_binary_index, row_chunks
from aggzoo.evaluation.options import EvaluationOptions
from aggzoo.evaluation.postprocess import PCAWhitening, rerank_metric_check
from aggzoo.evaluation.result import RANKING_METRICS, RetrievalResult, at_r_depth, result_from_predictions
from aggzoo.evaluation.search import search, search_without_self

__all__ = ["Stages", "evaluate_retrieval", "search_depth"]


@dataclass(frozen=True)
class Stages:
    """The fitted or bound parts of an evaluation, beside its options.

    Attributes:
        whitening: a fitted PCA(-whitening) applied to both descriptor sets before the search (fit it on
            training images, never on the benchmark).
        rerank: ``(database, queries, predictions, device) -> predictions``: SuperGlobal's re-ranking, or a
            re-ranker bound to the benchmark's images (instance tokens, local features).
        extractor: what extracts the descriptors, called as
            :func:`~aggzoo.evaluation.extraction.extract_descriptors` (the default), e.g.
            :class:`aggzoo.training.sharded_extraction.ShardedExtractor` (sharded across DDP ranks).
        cache: a :class:`~aggzoo.evaluation.descriptor_cache.DescriptorCache`: the database's distractors
            (or, without distractors, the whole database) are read from it when this model extracted them
            before under the same protocol, and stored in it otherwise.
    """

    whitening: PCAWhitening | None = None
    rerank: Any = None
    extractor: Callable[..., np.ndarray] | None = None
    cache: DescriptorCache | None = None


def search_depth(retrieval_set: RetrievalSet, options: EvaluationOptions, rerank: Any = None) -> int:
    """How many results per query the search returns: the largest Recall@k cut-off or the re-ranker's
    shortlist, capped at the number of candidates (the database, less the query itself when the queries are the
    database); for a metric of the whole ranking (mAP), every candidate (a two-stage search: its shortlist
    ``refine``, so mAP is then over the top ``M``); for MAP@R, the largest number of positives of a query."""
    top_m = getattr(rerank, "top_m", 0) or 0
    depth = max(max(options.ks), top_m)
    if set(retrieval_set.metrics) & set(RANKING_METRICS):
        depth = max(depth, options.search.refine or retrieval_set.num_candidates)
    return min(max(depth, at_r_depth(retrieval_set)), retrieval_set.num_candidates)


def evaluate_retrieval(
    model: nn.Module,
    retrieval_set: RetrievalSet,
    transform: Callable[[np.ndarray], torch.Tensor],
    options: EvaluationOptions = EvaluationOptions(),
    stages: Stages = Stages(),
) -> RetrievalResult:
    """Extract database and query descriptors, search, re-rank, and compute the benchmark's metrics.

    Args:
        model: ``images [B, 3, H, W] -> [B, D]``.
        retrieval_set: the benchmark (paths, ground truth, query boxes).
        transform: ``rgb uint8 [H, W, 3] -> float [3, H', W']`` (the protocol's).
        options: ``ks`` (Recall@k cut-offs; those larger than the database count the whole database),
            ``extraction``, ``search`` (with ``refine_store="disk"`` the database descriptors are written to a
            memory-mapped ``<name>_database.npy`` under ``store_dir``, default a temporary folder removed
            afterwards, and never held in RAM whole; a binary ``index`` shortlists by the model's binary codes,
            extracted with the float descriptors in the same pass, the store file then holding ``[N, D + bits]``),
            ``outputs.save_descriptors`` (keep both descriptor matrices in the result).
        stages: the fitted whitening, the re-ranker, the extractor (:class:`Stages`).
    """
    search_options, extraction = options.search, options.extraction
    rerank_metric_check(stages.rerank, search_options.metric)
    batch_record = batch_dependence_record(model, extraction.batch_size, name=retrieval_set.name)
    hashing = BinaryCodes(model, with_descriptors=True) if is_binary_index(search_options.index) else None
    if hashing is not None and search_options.refine is None:
        raise ConfigError(binary_refine_message(search_options.index))
    keep = options.outputs.save_descriptors
    extract = stages.extractor if stages.extractor is not None else extract_descriptors
    # with a binary first stage, one pass gives each image's float descriptor and its codes side by side
    # (exact in any float dtype: +-1), split afterwards; the store file then holds both
    net = hashing if hashing is not None else model
    boxes = retrieval_set.query_boxes  # revisited Oxford/Paris: queries cropped to their box before the transform
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="aggzoo-store-") as tmp:
        folder = Path(search_options.store_dir if search_options.store_dir is not None else tmp)
        if search_options.on_disk:
            folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{retrieval_set.name}_database.npy" if search_options.on_disk else None
        if stages.cache is not None:
            database = stages.cache.database(extract, net, retrieval_set, transform, options, out_path=path)
        else:
            database = extract(net, retrieval_set.database_paths, transform, extraction, out_path=path,
                               desc=f"{retrieval_set.name} database")
        # metric learning: the queries are the database images, extracted once
        self_search = retrieval_set.queries_are_database
        queries = database if self_search else extract(
            net, retrieval_set.query_paths, transform, extraction, desc=f"{retrieval_set.name} queries", boxes=boxes)
        codes = None
        if hashing is not None:
            (database, database_codes), (queries, query_codes) = hashing.split(database), hashing.split(queries)
            codes = (database_codes, query_codes)
        if stages.whitening is not None:
            queries = None if self_search else stages.whitening(queries)
            whitened = folder / f"{retrieval_set.name}_database_whitened.npy" if search_options.on_disk else None
            database = _map_rows(stages.whitening, database, whitened)
            queries = database if self_search else queries
        extracted = time.perf_counter()
        k = search_depth(retrieval_set, options, stages.rerank)
        if self_search:  # each query without its own image, removed by index
            predictions = search_without_self(database, k, search_options, codes=None if codes is None else codes[0])
        else:
            predictions = search(database, queries, k, search_options, codes=codes)
        if stages.rerank is not None:
            predictions = stages.rerank(database, queries, predictions,
                                        device=extraction.torch_device or model_device(model))
        searched = time.perf_counter()
        if keep and search_options.on_disk and search_options.store_dir is None:
            database = np.array(database)  # the temporary file goes away
        elif not keep:
            del database
    return result_from_predictions(
        retrieval_set, predictions, options.ks, descriptor_dim=queries.shape[1],
        extraction_seconds=extracted - start, search_seconds=searched - extracted,
        database_descriptors=database if keep else None, query_descriptors=queries if keep else None,
        extras=batch_record,
    )


def _map_rows(fn: Callable[[np.ndarray], np.ndarray], rows: np.ndarray, out_path: Path | None,
              chunk: int = 65536) -> np.ndarray:
    """``fn`` applied to ``rows`` a chunk at a time, into RAM or a memory-mapped ``.npy`` at ``out_path``."""
    if out_path is None:
        return fn(rows)
    out: np.ndarray | None = None
    for part in row_chunks(len(rows), chunk):
        mapped = fn(np.asarray(rows[part]))
        if out is None:
            out = open_store(out_path, rows.dtype, (len(rows), mapped.shape[1]))
        out[part] = mapped
    assert out is not None
    out.flush()
    return out
