"""The options of an evaluation, as frozen objects: one per stage of the loop.

Each class maps one-to-one onto a sub-node of ``evaluation:`` in ``conf/eval.yaml`` (``aggzoo.run`` builds
them once from the config; nothing below ``run/`` sees the config):

=====================  ===============================  ====================================================
class                  ``evaluation.<node>``            stage
=====================  ===============================  ====================================================
:class:`ExtractionOptions`  ``extraction``               images -> descriptors (batches, workers, precision)
:class:`TestTimeOptions`    ``test_time``                model transforms (multi-scale, TLC)
:class:`SearchOptions`      ``search``                   index and search (exact, approximate, two-stage)
:class:`PostprocessOptions` ``postprocess``              PCA(-whitening) of the descriptors
:class:`RerankOptions`      ``rerank``                   re-ranking of the shortlist
:class:`OutputOptions`      ``outputs``                  files written (pictures, predictions, descriptors)
=====================  ===============================  ====================================================

:class:`EvaluationOptions` groups them with the Recall@k cut-offs. The protocol node (input size, resize rule,
normalisation) is :class:`aggzoo.evaluation.protocol.EvalProtocol`. Values are checked when an object is made,
so a bad value fails before any image is read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from aggzoo.errors import ConfigError

__all__ = [
    "DEFAULT_KS",
    "METRICS",
    "PRECISIONS",
    "REFINE_STORES",
    "EvaluationOptions",
    "ExtractionOptions",
    "OutputOptions",
    "PostprocessOptions",
    "RerankOptions",
    "SearchOptions",
    "TestTimeOptions",
    "autocast_dtype_of",
    "check_metric",
]

#: Recall@k cut-offs of the VPR protocol
DEFAULT_KS = (1, 5, 10, 20)
#: Where the second stage of a two-stage search reads the full-precision descriptors.
REFINE_STORES = ("ram", "disk")
#: ``evaluation.search.metric``: inner product (higher first) or squared L2 distance (smaller first).
METRICS = ("ip", "l2")
#: ``evaluation.extraction.precision``: the dtype the model runs in under autocast during extraction (None: fp32).
PRECISIONS: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def check_metric(metric: str) -> str:
    """``metric`` if it is one of :data:`METRICS`, else one :class:`ConfigError`."""
    if metric not in METRICS:
        raise ConfigError(f"evaluation.search.metric={metric!r} is not a search metric; use ip (inner product, the "
                          "default) or l2 (squared Euclidean distance, as faiss.IndexFlatL2)")
    return metric


def autocast_dtype_of(precision: str) -> torch.dtype | None:
    """``"fp32"`` -> ``None`` (no autocast), ``"bf16"`` / ``"fp16"`` -> the autocast dtype."""
    if precision not in PRECISIONS:
        raise ConfigError(f"evaluation.extraction.precision={precision!r} is not a precision; use one of "
                          f"{', '.join(PRECISIONS)} (bf16/fp16 run the model under autocast, descriptors stay float32)")
    return PRECISIONS[precision]


@dataclass(frozen=True)
class ExtractionOptions:
    """How images become descriptors (:func:`aggzoo.evaluation.extraction.extract_descriptors`).

    Attributes:
        batch_size: images per forward pass (1 for a protocol that keeps each image's own size).
        num_workers: image-reading processes; ``None``: every core but one for 256+ images
            (:func:`aggzoo.data.workers.loader_workers`), 0: the main process.
        device: where the model runs; ``None``: where its parameters are.
        descriptor_dtype: storage of the ``[N, D]`` descriptors (``"float16"`` halves it).
        precision: ``"fp32"``, or ``"bf16"`` / ``"fp16"``: the model under autocast (GPU speed).
        channels_last: the model and its batches in the ``channels_last`` memory format.
        progress: tqdm bars over the batches; ``None``: only when stderr is a terminal.
        cache_dir: a folder of descriptors extracted once and reused by later evaluations of the same model,
            weights and protocol (:class:`aggzoo.evaluation.descriptor_cache.DescriptorCache`: the R1M
            distractors, or a whole database); ``None``: every evaluation extracts every image.
    """

    batch_size: int = 32
    num_workers: int | None = None
    device: str | None = None
    descriptor_dtype: str = "float32"
    precision: str = "fp32"
    channels_last: bool = False
    progress: bool | None = None
    cache_dir: str | Path | None = None

    def __post_init__(self) -> None:
        autocast_dtype_of(self.precision)
        if self.cache_dir is not None and (not isinstance(self.cache_dir, (str, Path)) or not str(self.cache_dir).strip()):
            raise ConfigError(f"evaluation.extraction.cache_dir must be a folder path or null, got {self.cache_dir!r}")
        if self.descriptor_dtype not in ("float32", "float16"):
            raise ConfigError(f"evaluation.extraction.descriptor_dtype={self.descriptor_dtype!r}: use float32 or float16")
        if int(self.batch_size) < 1:
            raise ConfigError(f"the evaluation batch size must be >= 1, got {self.batch_size}")

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return autocast_dtype_of(self.precision)

    @property
    def torch_device(self) -> torch.device | None:
        return torch.device(self.device) if self.device is not None else None


@dataclass(frozen=True)
class TestTimeOptions:
    """Transforms of the model at test time (:func:`aggzoo.evaluation.test_time.test_time_model`).

    Attributes:
        scales: multi-scale extraction, e.g. ``(0.707, 1.0, 1.414)``; ``(1.0,)``: one scale.
        multiscale_reduce: how the scales' descriptors are combined (``"mean"``, ``"max"``...).
        multiscale_interpolation: how each scale resizes the image tensor (``"bicubic"``; SuperGlobal: ``"bilinear"``).
        tlc_train_size: the training size; converts the model with TLC first (``None``: no conversion).
        pooling: ``"superglobal"``: SuperGlobal's GeM+ with regional GeM in place of a GeM head's pooling
            (:func:`aggzoo.models.superglobal.superglobal_model`); ``None``: the model's own.
        relu_floor: with ``pooling="superglobal"``, its ReLU+ floor in a ResNet backbone (0.014); ``None``: ReLUs kept.
        multiple: the side multiple each scale's size is rounded to (the protocol's, ``evaluation.protocol.multiple``);
            ``None``: the model's (:func:`~aggzoo.models.input_size.size_multiple`); 1 floors the sizes as
            torchvision / cirtorch / SuperGlobal do.
    """

    scales: tuple[float, ...] = (1.0,)
    multiscale_reduce: str = "mean"
    multiscale_interpolation: str = "bicubic"
    tlc_train_size: int | tuple[int, ...] | None = None
    pooling: str | None = None
    relu_floor: float | None = 0.014
    multiple: int | None = None

    def __post_init__(self) -> None:
        if self.pooling not in (None, "superglobal"):
            raise ConfigError(f"evaluation.test_time.pooling={self.pooling!r} is not a pooling swap: "
                              "superglobal (SuperGlobal's GeM+ and regional GeM) or null")
        if self.multiscale_interpolation not in ("bicubic", "bilinear"):
            raise ConfigError(f"evaluation.test_time.multiscale_interpolation={self.multiscale_interpolation!r}: "
                              "choose bicubic or bilinear")


@dataclass(frozen=True)
class SearchOptions:
    """Index and search (:func:`aggzoo.evaluation.search.search`, :func:`aggzoo.evaluation.index.build_index`).

    Attributes:
        metric: ``"ip"`` (inner product, highest first) or ``"l2"`` (squared L2 distance, smallest first:
            ``faiss.IndexFlatL2``). They rank unit-norm descriptors alike, others not.
        index: a FAISS ``index_factory`` string: ``"Flat"`` (exact), ``"SQfp16"``, ``"HNSW32"``,
            ``"IVF1024,PQ64"``...; or a FAISS binary index (``"BFlat"``...) over a model's binary codes.
        search_params: FAISS ``ParameterSpace`` string, e.g. ``"nprobe=32"`` or ``"efSearch=128"``.
        refine: two-stage search: the first stage's shortlist ``M`` per query, re-scored exactly.
        refine_store: where the second stage reads full-precision descriptors: ``"ram"`` (FAISS's
            ``IndexRefineFlat``) or ``"disk"`` (a memory-mapped ``.npy``: RAM holds only the codes).
        store_dir: folder of the disk store and token files (``None``: a temporary folder, removed afterwards).
        use_gpu: ``None``: a FAISS GPU index when FAISS sees a GPU.
        train_size: database rows sampled (with ``seed``) to train IVF/PQ indexes; ``None``: all.
        seed: the sampling seed.
    """

    metric: str = "ip"
    index: str = "Flat"
    search_params: str | None = None
    refine: int | None = None
    refine_store: str = "ram"
    store_dir: str | Path | None = None
    use_gpu: bool | None = None
    train_size: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        check_metric(self.metric)
        if self.refine_store not in REFINE_STORES:
            raise ConfigError(f"evaluation.search.refine_store={self.refine_store!r}: use one of {', '.join(REFINE_STORES)}")
        if self.refine is not None and int(self.refine) < 1:
            raise ConfigError(f"evaluation.search.refine (the shortlist size M) must be >= 1, got {self.refine}")

    @property
    def on_disk(self) -> bool:
        """The database descriptors of a two-stage search live in a memory-mapped file."""
        return self.refine is not None and self.refine_store == "disk"


@dataclass(frozen=True)
class PostprocessOptions:
    """PCA(-whitening) of the descriptors before the search (:class:`aggzoo.evaluation.postprocess.PCAWhitening`).

    Attributes:
        whitening: a saved ``.npz`` of a fitted whitening.
        whitening_fit: or what to fit it on: a folder of *training* images, a list of paths, or a
            :class:`~aggzoo.data.retrieval_set.RetrievalSet` (never the benchmark evaluated).
        whitening_dim: the output dimension (``None``: keep ``D``).
        whitening_kind: ``"whiten"`` (PCA-whitening + L2) or ``"project"`` (plain PCA, no L2).
    """

    whitening: str | Path | None = None
    whitening_fit: Any = None
    whitening_dim: int | None = None
    whitening_kind: str = "whiten"


@dataclass(frozen=True)
class RerankOptions:
    """Re-ranking of the global shortlist (:func:`aggzoo.evaluation.test_time.build_reranker`).

    Attributes:
        method: ``None``; ``"superglobal"`` (or ``True``, or a mapping of ``SuperGlobalRerank`` arguments);
            ``"instance_tokens"`` (late interaction); ``"mutual_nn"`` (SelaVPR's local features); ``"fol"``
            (FoL's reliable-region local features, mutual matches above cosine 0.7).
        k: the shortlist re-ranked (``None``: 400 for SuperGlobal, 100 for the others).
        tokens: ``K`` instance tokens kept per image (``"instance_tokens"``).
    """

    method: str | bool | Mapping[str, Any] | None = None
    k: int | None = None
    tokens: int = 16


@dataclass(frozen=True)
class OutputOptions:
    """What an evaluation writes, and where (:func:`aggzoo.evaluation.loop.evaluate_benchmarks`).

    Attributes:
        dir: the report folder (``results.json``, ``results.md``, pictures); ``None``: nothing is written.
        pictures: the recall/metric curves and one retrieval grid per benchmark.
        grid_queries, grid_k: rows and columns of the retrieval grid.
        save_predictions: ``predictions_<name>.npy`` (``[Q, K]`` database indices).
        save_descriptors: ``descriptors_<name>.npz`` (``database``, ``queries``).
        write_submissions: ``submission_<name>.txt`` in the MSLS challenge format.
    """

    dir: str | Path | None = None
    pictures: bool = True
    grid_queries: int = 6
    grid_k: int = 5
    save_predictions: bool = False
    save_descriptors: bool = False
    write_submissions: bool = False


@dataclass(frozen=True)
class EvaluationOptions:
    """Every option of one evaluation, one object per stage (see the module docstring)."""

    ks: tuple[int, ...] = DEFAULT_KS
    extraction: ExtractionOptions = field(default_factory=ExtractionOptions)
    test_time: TestTimeOptions = field(default_factory=TestTimeOptions)
    search: SearchOptions = field(default_factory=SearchOptions)
    postprocess: PostprocessOptions = field(default_factory=PostprocessOptions)
    rerank: RerankOptions = field(default_factory=RerankOptions)
    outputs: OutputOptions = field(default_factory=OutputOptions)

    def __post_init__(self) -> None:
        if not self.ks or any(int(k) < 1 for k in self.ks):
            raise ConfigError(f"recall_ks must be cut-offs k >= 1, got {list(self.ks)}")

    def settings(self, whitening: Any = None, reranker: Any = None) -> dict[str, Any]:
        """What ``results.json`` records of the search and post-processing (``meta.settings``)."""
        search, test_time = self.search, self.test_time
        tlc = test_time.tlc_train_size
        return {"index": search.index, "search_params": search.search_params,
                "descriptor_dtype": self.extraction.descriptor_dtype, "precision": self.extraction.precision,
                "refine": search.refine, "refine_store": search.refine_store if search.refine is not None else None,
                "metric": search.metric,
                "whitening_dim": whitening.out_dim if whitening is not None else None,
                "whitening_l2": whitening.l2 if whitening is not None else None,
                "rerank": vars(reranker) if reranker is not None else None, "scales": list(test_time.scales),
                "multiscale_reduce": test_time.multiscale_reduce,
                "multiscale_interpolation": test_time.multiscale_interpolation,
                "pooling": test_time.pooling,
                "relu_floor": test_time.relu_floor if test_time.pooling == "superglobal" else None,
                "tlc_train_size": None if tlc is None else list(tlc) if isinstance(tlc, Sequence) else [int(tlc)]}
