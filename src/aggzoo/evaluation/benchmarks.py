"""One call, many benchmarks: load each benchmark config, evaluate, and write the report files.

A benchmark config (``conf/benchmark/<name>.yaml``) is a single ``{<name>: <loader node>}`` entry, so
Hydra merges ``benchmark=[pitts30k_test,msls_val]`` into one mapping ``{pitts30k_test: node, msls_val: node}``
that :func:`evaluate_benchmarks` takes as it is. Benchmarks are loaded and evaluated one at a time, so
only one database's descriptors are in memory at once.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hydra.utils import instantiate
from torch import nn

from aggzoo.data.layout import list_images
from aggzoo.data.retrieval_set import RetrievalSet
from aggzoo.errors import ConfigError
from aggzoo.evaluation.late_interaction import InstanceTokenRerank
from aggzoo.evaluation.local_rerank import MutualNNRerank
from aggzoo.evaluation.postprocess import WHITENING_KINDS, PCAWhitening, SuperGlobalRerank, check_whitening_kind
from aggzoo.evaluation.report import (
    plot_recall_curves,
    plot_retrievals,
    published_figures,
    record_published,
    write_json,
    write_markdown,
)
from aggzoo.evaluation.retrieval import (
    DEFAULT_KS,
    PRECISIONS,
    RetrievalResult,
    autocast_dtype_of,
    evaluate_retrieval,
    extract_descriptors,
    rerank_metric_check,
)
from aggzoo.evaluation.submission import write_msls_submission
from aggzoo.models.input_size import size_multiple
from aggzoo.models.multiscale import MultiScale
from aggzoo.models.tlc import convert_tlc

__all__ = ["load_benchmark", "load_benchmarks", "fit_whitening", "test_time_model", "evaluate_benchmarks"]

log = logging.getLogger(__name__)


def load_benchmark(node: Any) -> RetrievalSet:
    """A loader node (``{_target_: ..., ...}``) or a :class:`RetrievalSet` -> :class:`RetrievalSet`.

    Unlike ``hydra.utils.instantiate(node)``, a loader's error (e.g. the missing-dataset message naming
    the expected layout) reaches the user as it is, not wrapped in Hydra's ``InstantiationException``.
    """
    if isinstance(node, RetrievalSet):
        return node
    loader = instantiate(node, _partial_=True)  # nested nodes (a generated root) are built here
    retrieval_set = loader()
    if not isinstance(retrieval_set, RetrievalSet):
        raise TypeError(f"benchmark loader {node.get('_target_')!r} returned {type(retrieval_set).__name__}, "
                        "not a RetrievalSet")
    return retrieval_set


def load_benchmarks(nodes: Mapping[str, Any] | None) -> dict[str, RetrievalSet]:
    """``{name: loader node}`` (the ``benchmark`` config group) -> ``{name: RetrievalSet}``."""
    return {str(name): load_benchmark(node) for name, node in (nodes or {}).items()}


def _fit_paths(source: Any) -> list[Path]:
    if isinstance(source, (str, Path)):
        return list(list_images(source))
    if isinstance(source, Sequence):
        return [Path(p) for p in source]
    retrieval_set = load_benchmark(source)
    return [*retrieval_set.database_paths, *retrieval_set.query_paths]


def fit_whitening(
    model: nn.Module, source: Any, transform: Any, *, dim: int | None = None, max_images: int | None = 20000,
    seed: int = 0, kind: str = "whiten", **extract: Any,
) -> PCAWhitening:
    """Fit :class:`PCAWhitening` on descriptors of training images.

    Args:
        source: a folder of images, a list of image paths, or a benchmark node / :class:`RetrievalSet`
            (its database and query images) — a *training* set, not the one evaluated.
        max_images: sample at most this many images (with ``seed``).
        kind: ``"whiten"`` (PCA-whitening + L2) or ``"project"`` (plain PCA, no L2; :data:`WHITENING_KINDS`).
        extract: passed to :func:`extract_descriptors` (``batch_size``, ``num_workers``, ``device``...).
    """
    check_whitening_kind(kind)
    paths = _fit_paths(source)
    if max_images is not None and len(paths) > max_images:
        keep = np.sort(np.random.default_rng(seed).choice(len(paths), max_images, replace=False))
        paths = [paths[i] for i in keep]
    descriptors = extract_descriptors(model, paths, transform, **extract)
    return PCAWhitening.fit(descriptors, dim, **WHITENING_KINDS[kind])


def test_time_model(
    model: nn.Module, *, scales: Sequence[float] = (1.0,), multiscale_reduce: str = "mean",
    tlc_train_size: int | Sequence[int] | None = None,
) -> nn.Module:
    """``model`` with the test-time options applied: TLC (a converted copy) and multi-scale pooling."""
    if tlc_train_size is not None:
        size = tlc_train_size if isinstance(tlc_train_size, int) else tuple(int(s) for s in tlc_train_size)
        model = convert_tlc(copy.deepcopy(model), size)  # a converted copy: the caller's model is unchanged
    if tuple(scales) != (1.0,):
        model = MultiScale(model, scales, reduce=multiscale_reduce, multiple=size_multiple(model))
    return model


#: ``evaluation.rerank=<name>``: the re-rankers chosen by name (``true`` / a mapping is SuperGlobal)
RERANKERS = ("superglobal", "instance_tokens", "mutual_nn")


def _as_rerank(rerank: Any, rerank_k: int | None = None,
               tokens: int = 16) -> SuperGlobalRerank | InstanceTokenRerank | MutualNNRerank | None:
    if rerank is None or rerank is False:
        return None
    if isinstance(rerank, (SuperGlobalRerank, InstanceTokenRerank, MutualNNRerank)):
        return rerank
    if rerank == "instance_tokens":
        return InstanceTokenRerank(top_m=100 if rerank_k is None else int(rerank_k), tokens=int(tokens))
    if rerank == "mutual_nn":  # SelaVPR: its local features, top 100 by default
        return MutualNNRerank(top_k=100 if rerank_k is None else int(rerank_k))
    if rerank is True or rerank == "superglobal":
        return SuperGlobalRerank() if rerank_k is None else SuperGlobalRerank(top_m=int(rerank_k))
    if isinstance(rerank, str):
        raise ConfigError(f"evaluation.rerank={rerank} is not a re-ranker; choose one of {', '.join(RERANKERS)}, "
                          "true (SuperGlobal's defaults), a mapping of SuperGlobalRerank arguments, or null")
    return SuperGlobalRerank(**dict(rerank))


def evaluate_benchmarks(
    model: nn.Module,
    benchmarks: Mapping[str, Any] | Sequence[RetrievalSet],
    transform: Any,
    *,
    output_dir: str | Path | None = None,
    ks: Sequence[int] = DEFAULT_KS,
    batch_size: int = 32,
    num_workers: int | None = None,
    device: torch.device | str | None = None,
    descriptor_dtype: str = "float32",
    autocast_dtype: torch.dtype | None = None,
    precision: str = "fp32",
    index: str = "Flat",
    search_params: str | None = None,
    use_gpu: bool | None = None,
    refine: int | None = None,
    refine_store: str = "ram",
    store_dir: str | Path | None = None,
    progress: bool | None = None,
    whitening: PCAWhitening | str | Path | None = None,
    whitening_fit: Any = None,
    whitening_dim: int | None = None,
    whitening_kind: str = "whiten",
    metric: str = "ip",
    rerank: SuperGlobalRerank | InstanceTokenRerank | Mapping[str, Any] | str | bool | None = None,
    rerank_k: int | None = None,
    tokens: int = 16,
    scales: Sequence[float] = (1.0,),
    multiscale_reduce: str = "mean",
    tlc_train_size: int | Sequence[int] | None = None,
    pictures: bool = True,
    grid_queries: int = 6,
    grid_k: int = 5,
    save_predictions: bool = False,
    save_descriptors: bool = False,
    write_submissions: bool = False,
    meta: Mapping[str, Any] | None = None,
    published: Mapping[str, float] | None = None,
    extractor: Any = None,
) -> list[RetrievalResult]:
    """Evaluate ``model`` on every benchmark and write the report.

    Args:
        benchmarks: ``{name: loader node}`` (``cfg.benchmark``) or :class:`RetrievalSet` values.
        transform: the evaluation transform (e.g. :func:`aggzoo.evaluation.protocol.protocol_transform`).
        output_dir: where ``results.json``, ``results.md``, ``recall_curves.png`` and
            ``retrievals_<name>.png`` go (nothing is written when ``None``).
        descriptor_dtype: ``"float16"`` halves descriptor memory (use ``index="SQfp16"`` to keep it
            half in the index too).
        precision: ``evaluation.precision``: ``"bf16"`` / ``"fp16"`` run the model under autocast
            during extraction (faster on GPUs; the recall cost is in benchmarks/eval_scale.py); an
            explicit ``autocast_dtype`` wins.
        index, search_params, use_gpu: see :func:`aggzoo.evaluation.retrieval.search`.
        refine, refine_store, store_dir: two-stage search: ``index`` gives a shortlist of ``refine``
            candidates, re-scored exactly against descriptors in RAM or (``"disk"``) in a memory-mapped
            file under ``store_dir`` (default a temporary folder); see
            :func:`aggzoo.evaluation.retrieval.evaluate_retrieval`.
        progress: tqdm bars over the extraction (``None``: only when stderr is a terminal).
        whitening: a fitted :class:`PCAWhitening` or the ``.npz`` it was saved to; or fit one here on
            ``whitening_fit`` (folder / paths / benchmark node of *training* images) to ``whitening_dim``,
            of ``whitening_kind`` (:func:`fit_whitening`; a loaded file keeps the kind it was fitted with).
        metric: ``"ip"`` | ``"l2"``, the search metric (:func:`aggzoo.evaluation.retrieval.search`).
        rerank: ``True`` (or ``"superglobal"``) for SuperGlobal's defaults, a mapping of
            :class:`SuperGlobalRerank` arguments, ``"instance_tokens"`` for late interaction of ``tokens``
            instance tokens per image (:class:`~aggzoo.evaluation.late_interaction.InstanceTokenRerank`;
            float16 token files under ``store_dir``), or an instance.
        rerank_k: the shortlist re-ranked (``top_m``; default 400 for SuperGlobal, 100 for instance tokens).
        tokens: ``K``, instance tokens kept per image (``rerank="instance_tokens"``).
        scales, multiscale_reduce, tlc_train_size: see :func:`test_time_model`.
        pictures: write the recall curves and one qualitative grid per benchmark.
        save_predictions: ``predictions_<name>.npy`` (``[Q, K]`` database indices).
        save_descriptors: ``descriptors_<name>.npz`` (``database``, ``queries``).
        write_submissions: ``submission_<name>.txt`` in the MSLS challenge format.
        meta: extra fields for ``results.json`` (checkpoint, config...).
        published: the model's published figures (a :class:`~aggzoo.hub.cfg.PretrainedCfg`'s
            ``metrics``: ``"<benchmark>/R@<k>" -> percent``), recorded beside ours in each result of a
            benchmark they name (by its config name or its own name): ``published`` and ``delta``.
        extractor: extracts the benchmark descriptors in place of
            :func:`~aggzoo.evaluation.retrieval.extract_descriptors` (e.g. sharded across DDP ranks).

    Returns:
        One :class:`RetrievalResult` per benchmark, in order.
    """
    items = list(benchmarks.items()) if isinstance(benchmarks, Mapping) else [(b.name, b) for b in benchmarks]
    if autocast_dtype is None:
        autocast_dtype = autocast_dtype_of(precision)
    if not items:
        raise ValueError("no benchmark selected: pass benchmark=<name> or benchmark=[a,b] (see conf/benchmark/)")
    out_dir = Path(output_dir) if output_dir is not None else None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    extract = dict(batch_size=batch_size, num_workers=num_workers, device=device)
    eval_model = test_time_model(model, scales=scales, multiscale_reduce=multiscale_reduce,
                                 tlc_train_size=tlc_train_size)
    reranker = _as_rerank(rerank, rerank_k, tokens)
    rerank_metric_check(reranker, metric)  # before any extraction
    if isinstance(whitening, (str, Path)):
        whitening = PCAWhitening.load(whitening)
    if whitening is None and whitening_fit is not None:
        whitening = fit_whitening(eval_model, whitening_fit, transform, dim=whitening_dim, kind=whitening_kind, **extract)
        log.info("PCA (%s) fitted: %d -> %d dims", whitening_kind, whitening.in_dim, whitening.out_dim)
        if out_dir is not None:
            whitening.save(out_dir / "whitening.npz")

    results = []
    for name, node in items:
        retrieval_set = load_benchmark(node)
        log.info("%s: %d queries, %d database images", name, retrieval_set.num_queries, retrieval_set.num_database)
        set_rerank = reranker
        if getattr(reranker, "needs_images", False):  # instance tokens / local features: from this set's images
            set_rerank = reranker.bind(eval_model, retrieval_set, transform, store_dir=store_dir, ks=ks,
                                       progress=progress, **extract)
        result = evaluate_retrieval(
            eval_model, retrieval_set, transform, ks=ks, dtype=np.dtype(descriptor_dtype),
            autocast_dtype=autocast_dtype, index=index, search_params=search_params, use_gpu=use_gpu,
            refine=refine, refine_store=refine_store, store_dir=store_dir, progress=progress,
            whitening=whitening, rerank=set_rerank, keep_descriptors=save_descriptors, extractor=extractor,
            metric=metric, **extract,
        )
        record_published(result, published_figures(published or {}, (name, result.name)))
        if set_rerank is not reranker:
            result.extras[reranker.stats_key] = set_rerank.stats
        results.append(result)
        log.info("%s: %s", name, ", ".join(f"R@{k} {100 * v:.2f}" for k, v in result.recalls.items()))
        if out_dir is not None:
            if save_predictions:
                np.save(out_dir / f"predictions_{name}.npy", result.predictions)
            if save_descriptors:
                np.savez(out_dir / f"descriptors_{name}.npz", database=result.database_descriptors,
                         queries=result.query_descriptors)
                result.database_descriptors = result.query_descriptors = None  # the file holds them now
            if write_submissions:
                write_msls_submission(retrieval_set, result.predictions, out_dir / f"submission_{name}.txt")
            if pictures:
                plot_retrievals(result, out_dir / f"retrievals_{name}.png", num_queries=grid_queries, k=grid_k)
    if out_dir is not None:
        settings = {"index": index, "search_params": search_params, "descriptor_dtype": descriptor_dtype,
                    "precision": next((k for k, v in PRECISIONS.items() if v == autocast_dtype), str(autocast_dtype)),
                    "refine": refine, "refine_store": refine_store if refine is not None else None,
                    "metric": metric,
                    "whitening_dim": whitening.out_dim if whitening is not None else None,
                    "whitening_l2": whitening.l2 if whitening is not None else None,
                    "rerank": vars(reranker) if reranker is not None else None, "scales": list(scales),
                    "multiscale_reduce": multiscale_reduce,
                    "tlc_train_size": None if tlc_train_size is None else np.atleast_1d(tlc_train_size).tolist()}
        write_json(results, out_dir / "results.json", meta={**dict(meta or {}), "settings": settings})
        write_markdown(results, out_dir / "results.md")
        if pictures:
            plot_recall_curves(results, out_dir / "recall_curves.png")
        log.info("report written to %s", out_dir)
    return results
