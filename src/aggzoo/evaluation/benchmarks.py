"""One call, many benchmarks: evaluate each, then write the report files.

Benchmarks are evaluated one at a time, so only one database's descriptors are in memory at once. The
benchmarks come as :class:`~aggzoo.data.retrieval_set.RetrievalSet` values (``aggzoo.run`` loads them from
the ``benchmark`` config group); the options as one :class:`~aggzoo.evaluation.options.EvaluationOptions`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from aggzoo.data.retrieval_set import RetrievalSet
from aggzoo.evaluation.descriptor_cache import DescriptorCache
from aggzoo.evaluation.loop import Stages, evaluate_retrieval
from aggzoo.evaluation.options import EvaluationOptions
from aggzoo.evaluation.postprocess import rerank_metric_check
from aggzoo.evaluation.report import (
    plot_recall_curves,
    plot_retrievals,
    published_figures,
    published_setup_figures,
    record_published,
    write_json,
    write_markdown,
)
from aggzoo.evaluation.result import RetrievalResult
from aggzoo.evaluation.submission import write_msls_submission
from aggzoo.evaluation.test_time import build_reranker, test_time_model, whitening_of

__all__ = ["evaluate_benchmarks"]

log = logging.getLogger(__name__)


def evaluate_benchmarks(
    model: nn.Module,
    benchmarks: Mapping[str, RetrievalSet] | Sequence[RetrievalSet],
    transform: Any,
    options: EvaluationOptions = EvaluationOptions(),
    *,
    meta: Mapping[str, Any] | None = None,
    published: Mapping[str, float] | None = None,
    extractor: Any = None,
    cache: DescriptorCache | None = None,
) -> list[RetrievalResult]:
    """Evaluate ``model`` on every benchmark and write the report.

    Args:
        benchmarks: ``{name: RetrievalSet}`` (the name is the config's, used for file names and the
            published figures) or a sequence of sets (named by their own names).
        transform: the evaluation transform (e.g. :meth:`aggzoo.evaluation.protocol.EvalProtocol.transform`).
        options: every option of the evaluation; ``options.outputs.dir`` is where ``results.json``,
            ``results.md``, ``recall_curves.png`` and ``retrievals_<name>.png`` go (nothing is written when
            ``None``).
        meta: extra fields for ``results.json`` (model, protocol, checkpoint...).
        published: the model's published figures (a :class:`~aggzoo.hub.cfg.PretrainedCfg`'s ``metrics``:
            ``"<benchmark>/R@<k>"`` and ``"<benchmark>/<setup>/<metric>"`` -> percent), recorded beside ours in
            each result of a benchmark they name (by its config name or its own name): ``published`` and ``delta``
            (Recall@k), ``published_metrics`` and ``delta_metrics`` (per setup: mAP, mP@k).
        extractor: extracts the descriptors in place of
            :func:`~aggzoo.evaluation.extraction.extract_descriptors` (e.g. sharded across DDP ranks).
        cache: where database descriptors are reused across runs (:class:`~aggzoo.evaluation.loop.Stages`).

    Returns:
        One :class:`RetrievalResult` per benchmark, in order.
    """
    items = list(benchmarks.items()) if isinstance(benchmarks, Mapping) else [(b.name, b) for b in benchmarks]
    if not items:
        raise ValueError("no benchmark selected: pass benchmark=<name> or benchmark=[a,b] (see conf/benchmark/)")
    outputs = options.outputs
    out_dir = Path(outputs.dir) if outputs.dir is not None else None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    eval_model = test_time_model(model, options.test_time)
    reranker = build_reranker(options.rerank)
    rerank_metric_check(reranker, options.search.metric)  # before any extraction
    whitening = whitening_of(eval_model, transform, options.postprocess, options.extraction)
    if whitening is not None and options.postprocess.whitening is None:
        log.info("PCA (%s) fitted: %d -> %d dims", options.postprocess.whitening_kind, whitening.in_dim, whitening.out_dim)
        if out_dir is not None:
            whitening.save(out_dir / "whitening.npz")

    results = []
    for name, retrieval_set in items:
        log.info("%s: %d queries, %d database images", name, retrieval_set.num_queries, retrieval_set.num_database)
        set_rerank = reranker
        if getattr(reranker, "needs_images", False):  # instance tokens / local features: from this set's images
            set_rerank = reranker.bind(eval_model, retrieval_set, transform, options)
        result = evaluate_retrieval(eval_model, retrieval_set, transform, options,
                                    Stages(whitening=whitening, rerank=set_rerank, extractor=extractor,
                                           cache=cache))
        names = (name, result.name)
        record_published(result, published_figures(published or {}, names),
                         published_setup_figures(published or {}, names))
        if set_rerank is not reranker:
            result.extras[reranker.stats_key] = set_rerank.stats
        results.append(result)
        log.info("%s: %s", name, ", ".join(f"R@{k} {100 * v:.2f}" for k, v in result.recalls.items()))
        if out_dir is not None:
            _write_benchmark_files(name, retrieval_set, result, options, out_dir)
    if out_dir is not None:
        settings = options.settings(whitening, reranker)
        write_json(results, out_dir / "results.json", meta={**dict(meta or {}), "settings": settings})
        write_markdown(results, out_dir / "results.md")
        if outputs.pictures:
            plot_recall_curves(results, out_dir / "recall_curves.png")
        log.info("report written to %s", out_dir)
    return results


def _write_benchmark_files(name: str, retrieval_set: RetrievalSet, result: RetrievalResult,
                           options: EvaluationOptions, out_dir: Path) -> None:
    """The per-benchmark files ``options.outputs`` asks for."""
    outputs = options.outputs
    if outputs.save_predictions:
        np.save(out_dir / f"predictions_{name}.npy", result.predictions)
    if outputs.save_descriptors:
        np.savez(out_dir / f"descriptors_{name}.npz", database=result.database_descriptors,
                 queries=result.query_descriptors)
        result.database_descriptors = result.query_descriptors = None  # the file holds them now
    if outputs.write_submissions:
        write_msls_submission(retrieval_set, result.predictions, out_dir / f"submission_{name}.txt")
    if outputs.pictures:
        plot_retrievals(result, out_dir / f"retrievals_{name}.png", num_queries=outputs.grid_queries, k=outputs.grid_k)
