"""The test-time parts of an evaluation, built from its options: the model's transforms (TLC, multi-scale),
a fitted PCA(-whitening), and the re-ranker of the shortlist."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from aggzoo.data.layout import list_images
from aggzoo.data.retrieval_set import RetrievalSet
from aggzoo.errors import ConfigError
from aggzoo.evaluation.extraction import extract_descriptors
from aggzoo.evaluation.late_interaction import InstanceTokenRerank
from aggzoo.evaluation.local_rerank import MutualNNRerank, fol_rerank
from aggzoo.evaluation.options import ExtractionOptions, PostprocessOptions, RerankOptions, TestTimeOptions
from aggzoo.evaluation.postprocess import WHITENING_KINDS, PCAWhitening, SuperGlobalRerank, check_whitening_kind
from aggzoo.models.input_size import size_multiple
from aggzoo.models.multiscale import MultiScale
from aggzoo.models.superglobal import superglobal_model
from aggzoo.models.tlc import convert_tlc

__all__ = ["RERANKERS", "build_reranker", "fit_whitening", "test_time_model", "whitening_of"]

#: ``evaluation.rerank.method=<name>``: the re-rankers chosen by name (``true`` / a mapping is SuperGlobal)
RERANKERS = ("superglobal", "instance_tokens", "mutual_nn", "fol")


def test_time_model(model: nn.Module, options: TestTimeOptions = TestTimeOptions()) -> nn.Module:
    """``model`` with the test-time options applied: SuperGlobal's pooling and ReLU+ (a converted copy), TLC (a
    converted copy) and multi-scale pooling."""
    if options.pooling == "superglobal":
        model = superglobal_model(model, relu_floor=options.relu_floor)
    if options.tlc_train_size is not None:
        tlc = options.tlc_train_size
        size = int(tlc) if isinstance(tlc, int) else tuple(int(s) for s in tlc)
        model = convert_tlc(copy.deepcopy(model), size)  # a converted copy: the caller's model is unchanged
    if tuple(options.scales) != (1.0,):
        model = MultiScale(model, options.scales, reduce=options.multiscale_reduce,
                           multiple=options.multiple or size_multiple(model), interpolation=options.multiscale_interpolation)
    return model


def _fit_paths(source: Any) -> list[Path]:
    if isinstance(source, (str, Path)):
        return list(list_images(source))
    if isinstance(source, RetrievalSet):
        return [*source.database_paths, *source.query_paths]
    if isinstance(source, Sequence):
        return [Path(p) for p in source]
    raise ConfigError(f"evaluation.postprocess.whitening_fit must be a folder of training images, a list of image "
                      f"paths or a benchmark, got {type(source).__name__}")


def fit_whitening(model: nn.Module, source: Any, transform: Any, options: PostprocessOptions = PostprocessOptions(),
                  extraction: ExtractionOptions = ExtractionOptions(), max_images: int | None = 20000) -> PCAWhitening:
    """:class:`PCAWhitening` of ``options.whitening_kind`` to ``options.whitening_dim``, fitted on descriptors of
    ``source``: a folder of images, a list of image paths, or a :class:`RetrievalSet` (its database and query
    images) -- a *training* set, never the one evaluated; at most ``max_images`` of them, sampled with seed 0."""
    kind = check_whitening_kind(options.whitening_kind)
    paths = _fit_paths(source)
    if max_images is not None and len(paths) > max_images:
        keep = np.sort(np.random.default_rng(0).choice(len(paths), max_images, replace=False))
        paths = [paths[i] for i in keep]
    descriptors = extract_descriptors(model, paths, transform, extraction, desc="whitening")
    return PCAWhitening.fit(descriptors, options.whitening_dim, **WHITENING_KINDS[kind])


def whitening_of(model: nn.Module, transform: Any, options: PostprocessOptions,
                 extraction: ExtractionOptions = ExtractionOptions()) -> PCAWhitening | None:
    """The whitening ``options`` ask for: loaded from ``options.whitening``, fitted on ``options.whitening_fit``,
    or ``None``."""
    if options.whitening is not None:
        return PCAWhitening.load(options.whitening)
    if options.whitening_fit is not None:
        return fit_whitening(model, options.whitening_fit, transform, options, extraction)
    return None


def build_reranker(options: RerankOptions) -> SuperGlobalRerank | InstanceTokenRerank | MutualNNRerank | None:
    """The re-ranker ``options.method`` names, with its shortlist ``options.k`` (default: its own)."""
    method, k = options.method, options.k
    if method is None or method is False:
        return None
    if isinstance(method, (SuperGlobalRerank, InstanceTokenRerank, MutualNNRerank)):
        return method
    if method == "instance_tokens":
        return InstanceTokenRerank(top_m=100 if k is None else int(k), tokens=int(options.tokens))
    if method == "mutual_nn":  # SelaVPR: its local features, top 100 by default
        return MutualNNRerank(top_k=100 if k is None else int(k))
    if method == "fol":  # FoL: its reliable regions' local features, matches above cosine 0.7, top 100
        return fol_rerank(top_k=100 if k is None else int(k))
    if method is True or method == "superglobal":
        return SuperGlobalRerank() if k is None else SuperGlobalRerank(top_m=int(k))
    if isinstance(method, str):
        raise ConfigError(f"evaluation.rerank.method={method} is not a re-ranker; choose one of {', '.join(RERANKERS)}, "
                          "true (SuperGlobal's defaults), a mapping of SuperGlobalRerank arguments, or null")
    return SuperGlobalRerank(**dict(method))
