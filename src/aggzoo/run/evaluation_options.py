"""The ``evaluation:`` node of ``conf/eval.yaml`` -> the frozen options objects of :mod:`aggzoo.evaluation.options`,
built once here so that nothing below ``run/`` reads a config.

Each sub-node maps one-to-one onto a dataclass (``extraction`` -> :class:`ExtractionOptions`, ``search`` ->
:class:`SearchOptions`, ...). The flat keys of earlier versions are moved to their node on the command line
(:mod:`aggzoo.run.evaluation_keys`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from aggzoo.data.retrieval_set import RetrievalSet
from aggzoo.errors import ConfigError
from aggzoo.evaluation.descriptor_cache import DescriptorCache
from aggzoo.evaluation.options import (
    EvaluationOptions,
    ExtractionOptions,
    OutputOptions,
    PostprocessOptions,
    RerankOptions,
    SearchOptions,
    TestTimeOptions,
)

__all__ = ["descriptor_cache", "evaluation_options", "whitening_fit_source"]

def _node(cfg: DictConfig, name: str) -> dict[str, Any]:
    node = OmegaConf.select(cfg, f"evaluation.{name}", default=None)
    if node is None:
        return {}
    if not isinstance(node, DictConfig):
        raise ConfigError(f"evaluation.{name} must be a node of options (see conf/eval.yaml), got {node!r}")
    return dict(OmegaConf.to_container(node, resolve=True))


def _known(name: str, values: Mapping[str, Any], accepted: Sequence[str]) -> dict[str, Any]:
    unknown = sorted(set(values) - set(accepted))
    if unknown:
        raise ConfigError(f"evaluation.{name}.{unknown[0]} is not an option of evaluation.{name}; it takes "
                          f"{', '.join(accepted)} (conf/eval.yaml)")
    return dict(values)


def evaluation_options(cfg: DictConfig, *, metric: str = "ip", whitening_kind: str = "whiten",
                       whitening_source: Any = None) -> EvaluationOptions:
    """The options of ``cfg``'s evaluation: ``recall_ks``, ``eval_batch_size``, ``num_workers`` and the
    ``evaluation.*`` sub-nodes; ``metric`` / ``whitening_kind``: the protocol's, used where the config says
    null; ``whitening_source``: ``evaluation.postprocess.whitening_fit`` resolved to images or a benchmark."""
    extraction = _known("extraction", _node(cfg, "extraction"),
                        ("descriptor_dtype", "precision", "progress", "cache_dir"))
    test_time = _known("test_time", _node(cfg, "test_time"), ("scales", "multiscale_reduce", "multiscale_interpolation",
                                                                    "tlc_train_size", "pooling", "relu_floor"))
    search = _known("search", _node(cfg, "search"),
                    ("metric", "index", "search_params", "refine", "refine_store", "store_dir", "use_gpu"))
    post = _known("postprocess", _node(cfg, "postprocess"),
                  ("whitening", "whitening_fit", "whitening_dim", "whitening_kind"))
    rerank = _known("rerank", _node(cfg, "rerank"), ("method", "k", "tokens"))
    outputs = _known("outputs", _node(cfg, "outputs"), ("pictures", "grid_queries", "grid_k", "save_predictions",
                                                        "save_descriptors", "write_submissions"))
    search["metric"] = search.get("metric") or metric
    search["index"] = search.get("index") or "Flat"
    search["refine_store"] = search.get("refine_store") or "ram"
    post["whitening_kind"] = post.get("whitening_kind") or whitening_kind
    if whitening_source is not None:
        post["whitening_fit"] = whitening_source
    if isinstance(post.get("whitening"), str):
        post["whitening"] = str(Path(post["whitening"]).expanduser())
    if test_time.get("scales") is not None:
        test_time["scales"] = tuple(float(s) for s in test_time["scales"])
    tlc = test_time.get("tlc_train_size")
    if isinstance(tlc, list):
        test_time["tlc_train_size"] = tuple(int(s) for s in tlc)
    return EvaluationOptions(
        ks=tuple(int(k) for k in cfg.recall_ks),
        extraction=ExtractionOptions(batch_size=int(cfg.eval_batch_size), num_workers=cfg.get("num_workers"),
                                     **extraction),
        test_time=TestTimeOptions(**test_time),
        search=SearchOptions(**search),
        postprocess=PostprocessOptions(**post),
        rerank=RerankOptions(**rerank),
        outputs=OutputOptions(dir=cfg.paths.output_dir, **outputs),
    )


def whitening_fit_source(cfg: DictConfig, load: Any) -> str | list[Path] | RetrievalSet | None:
    """``evaluation.postprocess.whitening_fit`` as :func:`aggzoo.evaluation.test_time.fit_whitening` takes it: a
    folder or list of images as given, a benchmark node loaded by ``load`` (``node -> RetrievalSet``)."""
    node = OmegaConf.select(cfg, "evaluation.postprocess.whitening_fit", default=None)
    if node is None:
        return None
    if isinstance(node, DictConfig):
        return load(node)
    value = OmegaConf.to_container(node, resolve=True) if not isinstance(node, str) else node
    return [Path(p) for p in value] if isinstance(value, list) else str(value)


def descriptor_cache(options: EvaluationOptions) -> DescriptorCache | None:
    """The cache of ``options.extraction.cache_dir`` (``evaluation.extraction.cache_dir``; ``None``: every run
    extracts every image)."""
    folder = options.extraction.cache_dir
    return DescriptorCache(folder) if folder is not None else None
