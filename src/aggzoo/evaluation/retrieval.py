"""Retrieval evaluation: descriptors -> nearest neighbours -> Recall@k.

The protocol every published VPR number follows (gmberton/VPR-methods-evaluation, gsv-cities, SALAD,
BoQ): L2-normalised global descriptors, exhaustive inner-product (= cosine = L2 ranking) search of the
database for each query, and a query counts as correct at ``k`` when any of its first ``k`` results is a
positive. Recall@k is over *all* queries; a query without any positive is a miss.

The search metric (``metric``, :data:`METRICS`): ``"ip"`` (inner product, the default) or ``"l2"``
(squared Euclidean distance, smallest first: FAISS's ``IndexFlatL2``, what gmberton/VPR-methods-evaluation
and gmberton/deep-visual-geo-localization-benchmark search with). On unit-norm descriptors the two rank
alike; on descriptors that are not unit-norm (the benchmark's GeM with ``l2=before_pool``, a PCA
projection without a final L2) they differ, and the model's protocol says which one its figures used.
Every index type of :func:`build_index` (exact, approximate, both two-stage stores, the GPU copy) is
built for the metric asked; the torch fallback computes either.

Ties in the similarity are broken by the lower database index, so the flat FAISS index (CPU or GPU) and
the torch fallback return the same ranking.

Large databases: an approximate FAISS index (IVF-PQ, HNSW, binary codes...) can be the first of two
stages (``refine=M``): it returns a shortlist of ``M`` candidates per query, which the second stage
re-scores exactly against the full-precision descriptors (:class:`TwoStageIndex`). Those live either in
RAM inside FAISS's ``IndexRefineFlat`` (``refine_store="ram"``), or on disk in a memory-mapped
``.npy`` file (``refine_store="disk"``, float16 or float32), so that RAM holds only the codes.

A binary first stage over a model's *second* descriptor (SelaVPR++: a hashing branch beside the float
descriptor) is the same two-stage search: ``index`` names a FAISS binary index (``"BFlat"``, exhaustive
Hamming; ``"BHNSW32"``...), built over the database's packed codes (:func:`pack_codes` of the model's
:class:`BinaryCodes`), and its Hamming shortlist of ``refine`` candidates is re-scored exactly against the
float descriptors as any other shortlist (``evaluation.index=BFlat evaluation.refine=100``). On L2-normalised
descriptors the inner-product order is the L2 order upstream re-ranks by.
"""

from __future__ import annotations

import re
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from aggzoo.data.progress import progress_bar
from aggzoo.data.retrieval_set import ImageListDataset, RetrievalSet
from aggzoo.data.workers import loader_workers
from aggzoo.errors import ConfigError
from aggzoo.evaluation.batch_dependence import batch_dependence_record
from aggzoo.evaluation.postprocess import PCAWhitening, SuperGlobalRerank
from aggzoo.models.features import Features
from aggzoo.models.modes import evaluating

try:  # FAISS is an optional dependency (extras cpu / gpu); torch covers exact search without it.
    import faiss
except ImportError:  # pragma: no cover - exercised only where faiss is not installed
    faiss = None

__all__ = [
    "BinaryCodes",
    "binary_refine_message",
    "METRICS",
    "PRECISIONS",
    "REFINE_STORES",
    "RetrievalResult",
    "TwoStageIndex",
    "extract_descriptors",
    "search",
    "search_with_scores",
    "build_index",
    "first_correct_rank",
    "recall_curve",
    "recall_at_k",
    "ks_beyond_database",
    "evaluate_retrieval",
    "result_from_predictions",
    "faiss_available",
    "is_binary_index",
    "pack_codes",
    "autocast_dtype_of",
    "check_metric",
    "rerank_metric_check",
]

DEFAULT_KS = (1, 5, 10, 20)
#: Where the second stage of a two-stage search reads the full-precision descriptors.
REFINE_STORES = ("ram", "disk")
#: ``evaluation.metric``: inner product (higher first) or squared L2 distance (smaller first).
METRICS = ("ip", "l2")
#: ``evaluation.precision``: the dtype the model runs in under autocast during extraction (None: fp32).
PRECISIONS: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def faiss_available() -> bool:
    """Whether FAISS is installed (without it, search falls back to torch, for tiny sets)."""
    return faiss is not None


def check_metric(metric: str) -> str:
    """``metric`` if it is one of :data:`METRICS`, else one :class:`ConfigError`."""
    if metric not in METRICS:
        raise ConfigError(f"evaluation.metric={metric!r} is not a search metric; use ip (inner product, the "
                          "default) or l2 (squared Euclidean distance, as faiss.IndexFlatL2)")
    return metric


def _faiss_metric(metric: str) -> int:
    return faiss.METRIC_L2 if check_metric(metric) == "l2" else faiss.METRIC_INNER_PRODUCT


def _metric_of(index: Any) -> str:
    """The metric a built index (FAISS or :class:`TwoStageIndex`) ranks by."""
    if isinstance(index, TwoStageIndex):
        return index.metric
    return "l2" if index.metric_type == faiss.METRIC_L2 else "ip"


# -- extraction ------------------------------------------------------------------------------------


def autocast_dtype_of(precision: str) -> torch.dtype | None:
    """``"fp32"`` -> ``None`` (no autocast), ``"bf16"`` / ``"fp16"`` -> the autocast dtype."""
    if precision not in PRECISIONS:
        raise ConfigError(f"evaluation.precision={precision!r} is not a precision; use one of "
                          f"{', '.join(PRECISIONS)} (bf16/fp16 run the model under autocast, descriptors stay float32)")
    return PRECISIONS[precision]


def _model_device(model: nn.Module) -> torch.device:
    for tensor in model.parameters():
        return tensor.device
    for tensor in model.buffers():
        return tensor.device
    return torch.device("cpu")


def extract_descriptors(
    model: nn.Module,
    paths: Sequence[str | Any],
    transform: Callable[[np.ndarray], torch.Tensor],
    *,
    batch_size: int = 32,
    num_workers: int | None = None,
    device: torch.device | str | None = None,
    dtype: np.dtype | type = np.float32,
    autocast_dtype: torch.dtype | None = None,
    channels_last: bool = False,
    out_path: str | Path | None = None,
    progress: bool | None = None,
    desc: str = "descriptors",
) -> np.ndarray:
    """Global descriptors of images read one batch at a time.

    Memory is the ``[N, D]`` output plus one batch: images are never all loaded, and the output is
    allocated once the first batch reveals ``D`` (in RAM, or as a memory-mapped ``.npy`` file at
    ``out_path``, so that a large database never has to fit in RAM).

    Args:
        model: ``images [B, 3, H, W] -> [B, D]``. Run in eval mode under ``torch.inference_mode``;
            its training mode is restored afterwards.
        paths: ``N`` image files.
        num_workers: DataLoader worker processes that read and resize the images while the model runs;
            ``None``: every core but one for ``N >= 256`` (:func:`aggzoo.data.workers.loader_workers`).
        transform: ``rgb uint8 [H, W, 3] -> float [3, H', W']`` (e.g. :func:`aggzoo.data.transforms.eval_transform`).
        device: where to run; default the device the model's parameters are on (the model is moved
            there if needed and moved back afterwards).
        dtype: storage type of the result (``np.float16`` halves the memory of large databases).
        autocast_dtype: ``torch.bfloat16`` / ``torch.float16`` to run the model under autocast.
        channels_last: run the model and its input batches in the ``channels_last`` memory format
            (faster convolutions on GPUs and with oneDNN on some CPUs); the model's weights are made
            contiguous again afterwards.
        out_path: write the descriptors to this ``.npy`` file, memory-mapped (``np.load(out_path,
            mmap_mode="r")`` reads it back), instead of an array in RAM.
        progress: a tqdm bar over the batches; ``None`` shows it only when stderr is a terminal.
        desc: the bar's label.

    Returns:
        ``[N, D]`` descriptors in ``dtype``, row ``i`` for ``paths[i]`` (an ``np.memmap`` with ``out_path``).
    """
    home = _model_device(model)
    device = torch.device(device) if device is not None else home
    # File order, never shuffled: batch-dependent heads (cross-image encoders) give other descriptors
    # for other batch compositions (aggzoo.evaluation.batch_dependence).
    loader = DataLoader(
        ImageListDataset(paths, transform), batch_size=batch_size, shuffle=False,
        num_workers=loader_workers(num_workers, len(paths)), pin_memory=device.type == "cuda", persistent_workers=False,
    )
    out: np.ndarray | None = None
    memory_format = torch.channels_last if channels_last else torch.preserve_format
    model.to(device, memory_format=memory_format)
    try:
        with evaluating(model), torch.inference_mode(), progress_bar(loader, progress, desc, unit="batch") as batches:
            for images, indices in batches:
                # pinned batches (pin_memory on CUDA) copy asynchronously, overlapping the previous forward
                images = images.to(device, non_blocking=True, memory_format=memory_format)
                with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                    descriptors = model(images)
                if descriptors.ndim != 2 or descriptors.shape[0] != images.shape[0]:
                    raise ValueError(
                        f"the model must return [B, D] descriptors, got shape {tuple(descriptors.shape)} "
                        f"for a batch of {images.shape[0]} images"
                    )
                if out is None:
                    shape = (len(paths), descriptors.shape[1])
                    out = (np.empty(shape, dtype=dtype) if out_path is None
                           else np.lib.format.open_memmap(out_path, mode="w+", dtype=np.dtype(dtype), shape=shape))
                out[indices.numpy()] = descriptors.float().cpu().numpy().astype(dtype, copy=False)
    finally:
        model.to(home)
        if channels_last:
            model.to(memory_format=torch.contiguous_format)
    if out is None:
        raise ValueError("no images to extract descriptors from (empty path list)")
    if isinstance(out, np.memmap):
        out.flush()
    return out


# -- binary codes of a model's hashing branch ------------------------------------------------------


#: the prefixes of faiss.index_binary_factory's strings (BFlat, BIVF<n>[_HNSW<m>], BHNSW<m>, BHash..., BMIHash...);
#: a float factory string never starts with one of them ("Bogus" is a bad float string, not a binary one)
_BINARY_FACTORY = re.compile(r"B(Flat|IVF\d|HNSW\d|Hash\d|MIHash\d)")


def is_binary_index(index: Any) -> bool:
    """Whether ``index`` names a FAISS binary index (``index_binary_factory``: ``"BFlat"``, ``"BHNSW32"``,
    ``"BIVF1024"``...): a first stage over a model's binary codes, not over its float descriptors."""
    return isinstance(index, str) and _BINARY_FACTORY.match(index.replace(" ", "")) is not None



def pack_codes(codes: np.ndarray) -> np.ndarray:
    """``[N, bits]`` codes in ``{-1, +1}`` -> ``[N, bits / 8]`` uint8 (bit 1 for ``+1``, most significant bit
    first: ``np.packbits``, as upstream packs them for ``faiss.IndexBinaryFlat``)."""
    codes = np.asarray(codes)
    if codes.ndim != 2 or codes.shape[1] % 8:
        raise ValueError(f"binary codes must be [N, bits] with bits a multiple of 8, got shape {codes.shape}")
    return np.packbits(codes > 0, axis=1)


def binary_refine_message(index: Any) -> str:
    """What a binary first stage (``evaluation.index=BFlat``...) without ``evaluation.refine`` is told."""
    return (f"evaluation.index={index} is a binary first stage: give the shortlist its Hamming search returns for "
            "the float descriptors to re-score, evaluation.refine=100 (SelaVPR++'s protocol)")


class BinaryCodes(nn.Module):
    """``images [B, 3, H, W] -> [B, bits]`` codes in ``{-1, +1}``: a model's hashing branch, as a model the one
    extraction loop (:func:`extract_descriptors`) runs.

    The model's head gives ``binary_codes(features)`` (SelaVPR++ built with ``hashing=True``), on the features of
    the backbone's hashing side path (``backbone.forward_hashing``) where it has one, else on its features.

    ``with_descriptors=True``: ``[B, D + bits]``, the model's float descriptor and then the codes, from one pass of
    the backbone (``backbone.forward_branches`` where it has one: the frozen ViT runs once for both side paths);
    :meth:`split` separates the two.
    """

    def __init__(self, model: nn.Module, *, with_descriptors: bool = False) -> None:
        super().__init__()
        head = getattr(model, "head", None)
        if not callable(getattr(head, "binary_codes", None)) or not getattr(head, "bits", 0):
            raise ConfigError(f"a binary first stage (evaluation.index=BFlat) searches the model's binary codes, which "
                              f"{type(head if head is not None else model).__name__} does not give (SelaVPR++ built with "
                              "hashing=True does: the *.official_rerank weights); evaluate this model with a float index "
                              "(evaluation.index=Flat)")
        self.model = model
        self.bits = int(head.bits)
        self.with_descriptors = with_descriptors
        self.train(model.training)

    def features(self, images: torch.Tensor) -> Features:
        backbone = self.model.backbone
        hashing = getattr(backbone, "forward_hashing", None)
        return hashing(images) if callable(hashing) else backbone(images)

    def branch_features(self, images: torch.Tensor) -> tuple[Features, Features]:
        """``(float features, hashing features)``: one backbone pass where ``backbone.forward_branches`` gives
        both, else the backbone's features and :meth:`features`."""
        backbone = self.model.backbone
        branches = getattr(backbone, "forward_branches", None)
        if callable(branches):
            return branches(images)
        if callable(getattr(backbone, "forward_hashing", None)):
            return backbone(images), self.features(images)
        features = backbone(images)
        return features, features

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if not self.with_descriptors:
            return self.model.head.binary_codes(self.features(images))
        float_features, hashing_features = self.branch_features(images)
        descriptors = self.model.head(float_features)
        codes = self.model.head.binary_codes(hashing_features)
        return torch.cat([descriptors, codes.to(descriptors.dtype)], dim=1)

    def split(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``[N, D + bits]`` rows of the ``with_descriptors`` output -> (``[N, D]`` descriptors, a view -- of the
        memory-mapped file too -- and ``[N, bits / 8]`` packed codes, :func:`pack_codes`)."""
        return rows[:, :-self.bits], pack_codes(rows[:, -self.bits:])


# -- search ----------------------------------------------------------------------------------------


def _as_float32(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32)


def _chunks(n: int, size: int) -> Sequence[slice]:
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


class TwoStageIndex:
    """Two-stage search: an approximate FAISS index returns ``shortlist`` candidates per query, which are
    re-scored exactly against the full-precision descriptors.

    Built by :func:`build_index` with ``refine=M``; ``search(queries, k) -> (scores, ids)`` like a FAISS
    index (``M < k`` is raised to ``k``).

    - ``store == "ram"``: ``first`` is FAISS's ``IndexRefineFlat`` around the approximate index; FAISS
      re-scores against the float32 copy it keeps (``k_factor = M / k``).
    - ``store == "disk"``: ``first`` is the approximate index alone (only its codes in RAM) and the
      candidates are re-scored here against ``vectors``, the ``[N, D]`` database as given -- typically
      an ``np.memmap`` of a float16/float32 ``.npy`` file, read row by row for the shortlists only.
      ``first`` may then also be a type FAISS builds for L2 only (binary codes: ``"ITQ256,LSHt"``,
      ``"LSHrt"``; ``"HNSW32_PQ64"``): on L2-normalised descriptors it shortlists as inner product would.
    - a FAISS *binary* index as ``first`` (:attr:`binary`): it holds a model's packed database codes and is
      searched with the queries' codes (``first_queries``); ``vectors`` are the float descriptors re-scored.

    ``metric`` is what the second stage scores by (``"ip"``: inner products, best first; ``"l2"``: squared
    distances, smallest first), as FAISS's own indexes return them.
    """

    def __init__(self, first: Any, shortlist: int, vectors: np.ndarray | None = None, metric: str = "ip") -> None:
        if shortlist < 1:
            raise ValueError(f"refine (the shortlist size M) must be >= 1, got {shortlist}")
        self.first = first
        self.shortlist = int(shortlist)
        self.vectors = vectors
        self.metric = check_metric(metric)

    @property
    def binary(self) -> bool:
        """The first stage is a binary (Hamming) index over a model's codes, searched with ``first_queries``."""
        return isinstance(self.first, faiss.IndexBinary)

    @property
    def store(self) -> str:
        return "ram" if self.vectors is None else "disk"

    @property
    def ntotal(self) -> int:
        return int(self.first.ntotal)

    def ram_bytes(self) -> int:
        """Bytes the index holds in RAM: codes, centroids, graph links and (``"ram"`` store) the float32
        copy; a memory-mapped store's pages are the OS's file cache, not counted."""
        if self.binary:
            return int(faiss.serialize_index_binary(self.first).nbytes)
        return int(faiss.serialize_index(self.first).nbytes)

    def _first_queries(self, first_queries: np.ndarray | None) -> np.ndarray:
        if first_queries is None:
            raise ValueError("this two-stage index shortlists by binary codes: pass the queries' packed codes as "
                             "first_queries (pack_codes of BinaryCodes(model))")
        return np.ascontiguousarray(first_queries, dtype=np.uint8)

    def shortlists(self, queries: np.ndarray, k: int, first_queries: np.ndarray | None = None) -> np.ndarray:
        """``[Q, max(M, k)]`` candidate ids of the first stage (``-1`` pads); a binary first stage searches
        ``first_queries`` (the queries' packed codes)."""
        m = min(max(self.shortlist, k), self.ntotal)
        if self.binary:
            return self.first.search(self._first_queries(first_queries), m)[1]
        first = faiss.downcast_index(self.first)
        base = first.base_index if isinstance(first, faiss.IndexRefine) else self.first
        return base.search(_as_float32(queries), m)[1]

    def search(self, queries: np.ndarray, k: int,
               first_queries: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        queries = _as_float32(queries)
        if not self.binary and self.vectors is None:  # FAISS's IndexRefineFlat re-scores its own shortlist
            m = min(max(self.shortlist, k), self.ntotal)
            params = faiss.IndexRefineSearchParameters()
            params.k_factor = (m + 0.5) / k  # FAISS truncates k * k_factor: exactly m candidates
            return self.first.search(queries, k, params=params)
        candidates = self.shortlists(queries, k, first_queries)
        scores, ids = _rescore(self.vectors, queries, candidates, k, metric=self.metric)
        return (-scores if self.metric == "l2" else scores), ids


def _rescore(vectors: np.ndarray, queries: np.ndarray, candidates: np.ndarray, k: int, *, metric: str = "ip",
             chunk_bytes: int = 64 << 20) -> tuple[np.ndarray, np.ndarray]:
    """Exact inner products (``metric="l2"``: negated squared L2 distances, so that higher is better in
    both) of each query with its ``[Q, M]`` candidates' rows of ``vectors``, best ``k`` first (ties by
    index); ``-1`` candidates score -inf.

    Per chunk of queries, the distinct candidate rows are read in one gather in file order (sorted
    indices: a memory-mapped store is read forwards, each row once even when several queries share it)
    into a float32 block ``[U, D]``, and FAISS scores every (query, candidate) pair against it in one call
    (``fvec_inner_products_by_idx``) -- no per-query Python loop and no ``[q, M, D]`` copy."""
    num_queries, m = candidates.shape
    dim = vectors.shape[1]
    scores_out = np.full((num_queries, k), -np.inf, dtype=np.float32)
    ids_out = np.full((num_queries, k), -1, dtype=np.int64)
    take = min(k, m)
    step = max(1, chunk_bytes // max(1, m * dim * 4))  # the block holds at most step * M rows
    for part in _chunks(num_queries, step):
        ids = candidates[part].astype(np.int64, copy=False)
        valid = ids >= 0
        rows, inverse = np.unique(np.where(valid, ids, 0), return_inverse=True)
        block = _as_float32(vectors[rows])                                      # [U, D]
        local = np.ascontiguousarray(inverse.reshape(ids.shape), dtype=np.int64)  # [q, M] rows of block
        q = _as_float32(queries[part])
        scores = np.empty(ids.shape, dtype=np.float32)
        by_idx = faiss.fvec_L2sqr_by_idx if metric == "l2" else faiss.fvec_inner_products_by_idx
        by_idx(faiss.swig_ptr(scores), faiss.swig_ptr(q), faiss.swig_ptr(block), faiss.swig_ptr(local), dim, len(q), m)
        if metric == "l2":
            np.negative(scores, out=scores)
        scores[~valid] = -np.inf
        ids = np.where(valid, ids, np.iinfo(np.int64).max)
        order = np.lexsort((ids, -scores), axis=1)[:, :take]
        scores_out[part, :take] = np.take_along_axis(scores, order, axis=1)
        best = np.take_along_axis(ids, order, axis=1)
        ids_out[part, :take] = np.where(best == np.iinfo(np.int64).max, -1, best)
    return scores_out, ids_out


def _keep_alive(index: Any, owner: Any) -> Any:
    """``index`` holding a Python reference to ``owner`` (the GpuResources a GPU index uses), so that it
    is not freed while the index lives. FAISS's wrappers refuse unknown attributes on their objects
    (faiss >= 1.8), so this goes through ``referenced_objects``, the one attribute FAISS itself keeps such
    references in (``IndexIVF`` keeps its quantizer there)."""
    refs = getattr(index, "referenced_objects", None)
    index.referenced_objects = [*(refs or ()), owner]
    return index


def build_index(
    database: np.ndarray,
    *,
    index: str = "Flat",
    search_params: str | None = None,
    use_gpu: bool | None = None,
    train_size: int | None = None,
    seed: int = 0,
    refine: int | None = None,
    refine_store: str = "ram",
    codes: np.ndarray | None = None,
    metric: str = "ip",
) -> Any:
    """A FAISS index holding ``database`` (trained first when the type needs it), built for ``metric``
    (``"ip"``: inner product; ``"l2"``: squared L2 distance).

    Args mean what they mean in :func:`search`. Build once and pass the result as ``index=`` to
    :func:`search` to query it several times. Index types without a GPU version (HNSW, flat SQ)
    stay on the CPU even when ``use_gpu`` asks for the GPU; two-stage indexes (``refine``) always do.
    With ``refine`` the result is a :class:`TwoStageIndex`; with ``codes`` (the database's packed binary
    codes, :func:`pack_codes`) and a binary ``index`` its first stage is that binary index over them.
    """
    if faiss is None:
        raise ImportError("build_index needs faiss: pip install 'aggzoo[cpu]' (or [gpu])")
    wanted = _faiss_metric(metric)
    if refine is not None and refine_store not in REFINE_STORES:
        raise ValueError(f"refine_store must be one of {REFINE_STORES}, got {refine_store!r}")
    if refine is not None and refine < 1:
        raise ValueError(f"refine (the shortlist size M) must be >= 1, got {refine}")
    database = np.asarray(database) if not isinstance(database, np.memmap) else database
    if is_binary_index(index) or codes is not None:
        return _binary_two_stage(database, codes, index, refine, search_params, train_size, seed, metric)
    try:
        base = faiss.index_factory(database.shape[1], index, wanted)
    except RuntimeError as error:
        if "METRIC_L2" not in str(error) or wanted == faiss.METRIC_L2:
            raise
        base = faiss.index_factory(database.shape[1], index, faiss.METRIC_L2)  # LSH: refused below or shortlists
    if base.metric_type != wanted and not (refine is not None and refine_store == "disk" and metric == "ip"):
        # Some types (binary LSH/ITQ codes, HNSW over PQ codes) silently build with L2: their scores would
        # rank backwards. As the first stage of a "disk" two-stage search they are fine: only their
        # shortlist is used (L2 ranks L2-normalised descriptors as inner product does) and aggzoo re-scores it.
        if metric == "l2":  # no FAISS type is known to do this; refuse rather than rank by another metric
            raise ValueError(f"FAISS builds {index!r} without the L2 metric asked (metric={base.metric_type})")
        raise ValueError(f"FAISS builds {index!r} with the L2 metric only, but aggzoo ranks by inner product; "
                         "pick a type that supports METRIC_INNER_PRODUCT (Flat, SQfp16, HNSW32, IVF...,PQ..., ...), "
                         "use it as the first stage of a two-stage search with refine_store='disk', "
                         "or search by L2 distance (metric='l2')")
    inner = faiss.downcast_index(base)
    if getattr(inner, "do_polysemous_training", False):
        # On by default for IVF-PQ, it re-orders PQ codes for Hamming filtering we never use and
        # multiplies training time by ~15 (100 s instead of 6 s for 2k x 64-D).
        inner.do_polysemous_training = False
    cpu_index = base
    if refine is not None and refine_store == "ram":
        cpu_index = faiss.IndexRefineFlat(base)  # FAISS's Python wrapper keeps `base` referenced
    gpu = (faiss.get_num_gpus() > 0 if use_gpu is None else use_gpu) and refine is None
    if use_gpu and faiss.get_num_gpus() == 0:
        raise RuntimeError("use_gpu=True but this faiss build sees no GPU (install faiss-gpu, check CUDA)")
    built = cpu_index
    if gpu:
        resources = faiss.StandardGpuResources()
        try:
            built = _keep_alive(faiss.index_cpu_to_gpu(resources, 0, cpu_index), resources)
        except RuntimeError:  # no GPU implementation of this index type: search on the CPU
            built = cpu_index
    if not built.is_trained:
        built.train(_as_float32(database[_training_rows(len(database), train_size, seed)]))
    for part in _chunks(len(database), 65536):  # float16 storage stays float16 outside one chunk
        built.add(_as_float32(database[part]))
    if search_params:
        on_gpu = built is not cpu_index
        # On an IndexRefine, ParameterSpace passes nprobe / efSearch on to the first-stage index.
        (faiss.GpuParameterSpace() if on_gpu else faiss.ParameterSpace()).set_index_parameters(built, search_params)
    if refine is not None:
        return TwoStageIndex(built, refine, vectors=database if refine_store == "disk" else None, metric=metric)
    return built


def _training_rows(n: int, train_size: int | None, seed: int) -> np.ndarray:
    """Sorted rows an index trains on: all ``n``, or ``train_size`` of them drawn without replacement."""
    size = n if train_size is None else min(train_size, n)
    return np.sort(np.random.default_rng(seed).choice(n, size=size, replace=False))


def _binary_two_stage(database: np.ndarray, codes: np.ndarray | None, index: str, refine: int | None,
                      search_params: str | None, train_size: int | None, seed: int,
                      metric: str = "ip") -> TwoStageIndex:
    """A :class:`TwoStageIndex` whose first stage is the binary index ``index`` over ``codes``."""
    if not is_binary_index(index):
        raise ValueError(f"binary codes are searched by a FAISS binary index (BFlat, BHNSW32, BIVF...), not {index!r}")
    if codes is None:
        raise ValueError(f"index {index!r} is a binary first stage: it needs the database's packed codes (codes=)")
    if refine is None:
        raise ConfigError(binary_refine_message(index))
    codes = np.ascontiguousarray(codes, dtype=np.uint8)
    if codes.ndim != 2 or len(codes) != len(database):
        raise ValueError(f"codes must be [N, bytes] for the {len(database)} database rows, got shape {codes.shape}")
    first = faiss.index_binary_factory(8 * codes.shape[1], index)
    if not first.is_trained:
        first.train(codes[_training_rows(len(codes), train_size, seed)])
    first.add(codes)
    if search_params:
        for item in str(search_params).split(","):
            name, _, value = item.partition("=")
            target = faiss.downcast_IndexBinary(first)
            if name.strip() == "efSearch" and hasattr(target, "hnsw"):
                target.hnsw.efSearch = int(value)
            elif name.strip() == "nprobe" and hasattr(target, "nprobe"):
                target.nprobe = int(value)
            else:
                raise ValueError(f"search parameter {item!r} does not apply to the binary index {index!r}")
    return TwoStageIndex(first, refine, vectors=database, metric=metric)


_EXACT_INDEX_TYPES = {"IndexFlat", "IndexFlatIP", "IndexFlatL2", "GpuIndexFlat", "GpuIndexFlatIP", "GpuIndexFlatL2"}


def _is_exact(index: Any) -> bool:
    """Exhaustive search (so ties past the k-th result can be ordered by index)?"""
    if isinstance(index, str):
        return index.replace(" ", "") in ("Flat", "SQfp16")
    if isinstance(index, TwoStageIndex):
        return False
    return type(faiss.downcast_index(index)).__name__ in _EXACT_INDEX_TYPES


def _torch_search(database: np.ndarray, queries: np.ndarray, k: int, metric: str = "ip") -> tuple[np.ndarray, np.ndarray]:
    """Scores higher-better (``metric="l2"``: negated squared distances)."""
    db = torch.from_numpy(_as_float32(database))
    db_sq = (db * db).sum(1) if metric == "l2" else None
    all_scores, all_ids = [], []
    for part in _chunks(len(queries), 1024):
        q = torch.from_numpy(_as_float32(queries[part]))
        sims = q @ db.T
        if db_sq is not None:
            sims = 2 * sims - (q * q).sum(1, keepdim=True) - db_sq
        scores, ids = torch.topk(sims, k, dim=1)
        all_scores.append(scores.numpy())
        all_ids.append(ids.numpy())
    return np.concatenate(all_scores), np.concatenate(all_ids).astype(np.int64)


def _order_ties_by_index(
    scores: np.ndarray, ids: np.ndarray, k: int, database: np.ndarray, queries: np.ndarray, exact: bool,
    metric: str = "ip",
) -> tuple[np.ndarray, np.ndarray]:
    """Keep the best ``k`` of ``k' >= k`` candidates (``scores`` higher-better), equal scores ordered by
    database index.

    For exact search, a query whose tie group may continue past the ``k'`` candidates (its last
    candidate scores the same as its ``k``-th) is re-ranked against the whole database.
    """
    ids = np.where(ids < 0, np.iinfo(np.int64).max, ids)  # faiss pads with -1: rank those last
    scores = np.where(ids == np.iinfo(np.int64).max, -np.inf, scores)
    order = np.lexsort((ids, -scores), axis=1)
    scores = np.take_along_axis(scores, order, axis=1)
    ids = np.take_along_axis(ids, order, axis=1)
    if exact and scores.shape[1] > k and scores.shape[1] < len(database):
        ragged = np.flatnonzero(scores[:, k - 1] == scores[:, -1])
        db32 = _as_float32(database) if ragged.size else None
        db_sq = np.einsum("nd,nd->n", db32, db32) if ragged.size and metric == "l2" else None
        for q in ragged:
            query = _as_float32(queries[q])
            row = db32 @ query
            if db_sq is not None:  # negated squared distance, higher-better like the inner product
                row = 2 * row - np.dot(query, query) - db_sq
            full = np.lexsort((np.arange(len(row)), -row))[:k]
            ids[q, :k], scores[q, :k] = full, row[full]
    ids = ids[:, :k].copy()
    ids[ids == np.iinfo(np.int64).max] = -1
    return scores[:, :k].copy(), ids


def search_with_scores(
    database: np.ndarray,
    queries: np.ndarray,
    k: int,
    *,
    index: str | Any = "Flat",
    search_params: str | None = None,
    use_gpu: bool | None = None,
    train_size: int | None = None,
    seed: int = 0,
    refine: int | None = None,
    refine_store: str = "ram",
    codes: tuple[np.ndarray, np.ndarray] | None = None,
    metric: str = "ip",
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`search` that also returns the ``[Q, k]`` scores of the results: inner products
    (``metric="ip"``, descending) or squared L2 distances (``metric="l2"``, ascending), as FAISS returns
    them; ``-1`` pads score ``-inf`` (ip) or ``inf`` (l2)."""
    check_metric(metric)
    database, queries = np.asarray(database), np.asarray(queries)
    if database.ndim != 2 or queries.ndim != 2 or database.shape[1] != queries.shape[1]:
        raise ValueError(f"database [N, D] and queries [Q, D] must share D; got {database.shape} and {queries.shape}")
    if not 1 <= k <= len(database):
        raise ValueError(f"k must be in [1, {len(database)}] (the database size), got {k}")
    exact = _is_exact(index) and (refine is None or not isinstance(index, str)) and codes is None
    # A few extra candidates let ties straddling the k-th place be ordered by index.
    k_search = min(len(database), k + 8) if exact else k
    if faiss is not None:
        built = index if not isinstance(index, str) else build_index(
            database, index=index, search_params=search_params, use_gpu=use_gpu, train_size=train_size, seed=seed,
            refine=refine, refine_store=refine_store, codes=None if codes is None else codes[0], metric=metric)
        if built.ntotal != len(database):
            raise ValueError(f"the prebuilt index holds {built.ntotal} vectors, the database {len(database)}")
        if _metric_of(built) != metric:
            raise ValueError(f"the prebuilt index ranks by {_metric_of(built)}, the search asks metric={metric!r}; "
                             f"build it with build_index(..., metric={metric!r})")
        if isinstance(built, TwoStageIndex) and built.binary:
            scores, ids = built.search(queries, k_search, first_queries=None if codes is None else codes[1])
        else:
            scores, ids = built.search(_as_float32(queries), k_search)
        ids = ids.astype(np.int64, copy=False)
        if metric == "l2":
            scores = -scores  # higher-better, as inner products, for the tie ordering
    elif exact:
        scores, ids = _torch_search(database, queries, k_search, metric)
    elif codes is not None or is_binary_index(index):
        raise ImportError(f"the binary first stage {index!r} needs faiss: pip install 'aggzoo[cpu]' (or [gpu])")
    else:
        raise ImportError(f"index {index!r} needs faiss: pip install 'aggzoo[cpu]' (or [gpu])")
    scores, ids = _order_ties_by_index(scores, ids, k, database, queries, exact, metric)
    return (-scores if metric == "l2" else scores), ids


def search(
    database: np.ndarray,
    queries: np.ndarray,
    k: int,
    *,
    index: str | Any = "Flat",
    search_params: str | None = None,
    use_gpu: bool | None = None,
    train_size: int | None = None,
    seed: int = 0,
    refine: int | None = None,
    refine_store: str = "ram",
    codes: tuple[np.ndarray, np.ndarray] | None = None,
    metric: str = "ip",
) -> np.ndarray:
    """Top-``k`` database rows for each query by inner product (or L2 distance), best first.

    Args:
        database: ``[N, D]`` descriptors (float32 or float16), L2-normalised for cosine ranking.
        queries: ``[Q, D]``.
        k: results per query, ``1 <= k <= N``.
        index: a FAISS ``index_factory`` string. ``"Flat"`` (default) is exact; ``"SQfp16"`` stores the
            database in float16 (half the memory, exact up to float16 rounding); approximate ones for
            large databases: ``"HNSW32"``, ``"IVF1024,PQ64"`` (``D`` divisible by the PQ size,
            ``N`` >= ~39 x the list count to train), ``"IVF4096,Flat"``... or an index from
            :func:`build_index` holding ``database`` (built once, searched many times).
        search_params: FAISS ``ParameterSpace`` string, e.g. ``"nprobe=32"`` or ``"efSearch=128"``.
        use_gpu: ``None`` uses a FAISS GPU index when FAISS sees a GPU.
        train_size: database rows sampled (with ``seed``) to train IVF/PQ indexes; default all.
        refine: two-stage search (:class:`TwoStageIndex`): ``index`` returns a shortlist of ``refine``
            (``M``) candidates per query, re-scored exactly; the result is the exact top-``k`` of the
            shortlist. ``None``: one stage.
        refine_store: where the second stage reads full-precision vectors: ``"ram"`` (FAISS's
            ``IndexRefineFlat``, a float32 copy) or ``"disk"`` (``database`` itself, e.g. an
            ``np.memmap`` from :func:`extract_descriptors` with ``out_path``: RAM holds only the codes).
        codes: ``(database codes, query codes)``, packed (:func:`pack_codes`), for a binary first stage:
            ``index`` a FAISS binary index (``"BFlat"``), whose Hamming top-``refine`` is re-scored against
            ``database`` (required then).
        metric: ``"ip"`` (inner product, highest first) or ``"l2"`` (squared L2 distance, smallest first:
            ``faiss.IndexFlatL2``, as gmberton/deep-visual-geo-localization-benchmark and
            VPR-methods-evaluation search). They rank unit-norm descriptors alike, others not. Every
            ``index`` and both refine stores are built for it; a prebuilt ``index`` must have been built
            for it.

    Returns:
        ``[Q, k]`` ``int64`` database indices, most similar first; equal similarities in index order
        (approximate indexes may pad with ``-1`` when they find fewer than ``k``).

    Without FAISS installed, exact search runs in torch (queries in blocks of 1024).
    """
    return search_with_scores(
        database, queries, k, index=index, search_params=search_params, use_gpu=use_gpu,
        train_size=train_size, seed=seed, refine=refine, refine_store=refine_store, codes=codes, metric=metric,
    )[1]


# -- metrics ---------------------------------------------------------------------------------------


def first_correct_rank(predictions: np.ndarray, positives: Sequence[np.ndarray]) -> np.ndarray:
    """Per query, the 0-based rank of the first positive among ``predictions``, or ``-1``."""
    predictions = np.asarray(predictions)
    if predictions.ndim != 2 or len(predictions) != len(positives):
        raise ValueError(
            f"predictions must be [Q, k] with one row per positive list; got {predictions.shape} "
            f"for {len(positives)} queries"
        )
    ranks = np.full(len(predictions), -1, dtype=np.int64)
    for q, (row, pos) in enumerate(zip(predictions, positives)):
        hits = np.flatnonzero(np.isin(row, pos))
        if hits.size:
            ranks[q] = hits[0]
    return ranks


def recall_curve(predictions: np.ndarray, positives: Sequence[np.ndarray]) -> np.ndarray:
    """Recall@k for every ``k = 1 .. predictions.shape[1]`` (``curve[k - 1]``), over all queries."""
    ranks = first_correct_rank(predictions, positives)
    width = np.asarray(predictions).shape[1]
    counts = np.bincount(ranks[ranks >= 0], minlength=width)
    return np.cumsum(counts) / max(len(ranks), 1)


def ks_beyond_database(ks: Iterable[int], num_database: int) -> list[int]:
    """The cut-offs of ``ks`` above the database size. The one rule for them, everywhere Recall@k is
    computed (test, ``eval.py``, validation): ``k >= 1`` is required (the config check refuses less), and
    a ``k`` above the database size is reported as Recall@N_db (the whole database is retrieved), with a
    note under the results table that names these ``k``."""
    return sorted(int(k) for k in ks if int(k) > num_database)


def recall_at_k(
    predictions: np.ndarray,
    positives: Sequence[np.ndarray],
    ks: Sequence[int] = DEFAULT_KS,
    *,
    num_database: int | None = None,
) -> dict[int, float]:
    """Recall@k: fraction of all queries with a positive among their first ``k`` predictions.

    Args:
        predictions: ``[Q, K]`` ranked database indices.
        positives: per query, the database indices that count as correct (may be empty: a miss).
        ks: cut-offs; each must be ``<= K`` unless the predictions rank the whole database
            (``num_database == K``), where any larger ``k`` equals Recall@K.
    """
    width = np.asarray(predictions).shape[1]
    for k in ks:
        if k < 1 or (k > width and num_database != width):
            raise ValueError(
                f"Recall@{k} needs at least {k} predictions per query, got {width}; search with k >= {max(ks)}"
            )
    curve = recall_curve(predictions, positives)
    return {int(k): float(curve[min(k, width) - 1]) for k in ks}


# -- driver ----------------------------------------------------------------------------------------


@dataclass
class RetrievalResult:
    """One benchmark's evaluation.

    Attributes:
        recalls: ``{k: Recall@k}`` as fractions in [0, 1].
        predictions: ``[Q, K]`` ranked database indices (``K = max(ks)`` or the database size).
        curve: Recall@k for every ``k = 1..K``.
        retrieval_set: the evaluated set (paths and positives), for pictures and submissions.
        database_descriptors, query_descriptors: ``[N_db, D]``, ``[Q, D]`` when asked to keep them.
    """

    name: str
    recalls: dict[int, float]
    num_queries: int
    num_database: int
    queries_without_positive: int
    predictions: np.ndarray
    curve: np.ndarray
    descriptor_dim: int = 0
    extraction_seconds: float = 0.0
    search_seconds: float = 0.0
    retrieval_set: RetrievalSet | None = field(default=None, repr=False)
    database_descriptors: np.ndarray | None = field(default=None, repr=False)
    query_descriptors: np.ndarray | None = field(default=None, repr=False)
    extras: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """JSON-ready fields (no arrays except the short curve)."""
        return {
            "name": self.name,
            "recalls": {str(k): v for k, v in self.recalls.items()},
            "num_queries": self.num_queries,
            "num_database": self.num_database,
            "queries_without_positive": self.queries_without_positive,
            "descriptor_dim": self.descriptor_dim,
            "extraction_seconds": round(self.extraction_seconds, 3),
            "search_seconds": round(self.search_seconds, 3),
            "curve": [float(v) for v in self.curve],
            **self.extras,
        }


def evaluate_retrieval(
    model: nn.Module,
    retrieval_set: RetrievalSet,
    transform: Callable[[np.ndarray], torch.Tensor],
    *,
    ks: Sequence[int] = DEFAULT_KS,
    batch_size: int = 32,
    num_workers: int | None = None,
    device: torch.device | str | None = None,
    dtype: np.dtype | type = np.float32,
    autocast_dtype: torch.dtype | None = None,
    index: str = "Flat",
    search_params: str | None = None,
    use_gpu: bool | None = None,
    whitening: PCAWhitening | None = None,
    rerank: SuperGlobalRerank | None = None,
    keep_descriptors: bool = False,
    refine: int | None = None,
    refine_store: str = "ram",
    store_dir: str | Path | None = None,
    progress: bool | None = None,
    extractor: Callable[..., np.ndarray] | None = None,
    metric: str = "ip",
) -> RetrievalResult:
    """Extract database and query descriptors, search, and compute Recall@k.

    Args:
        ks: Recall@k cut-offs; those larger than the database are reported as Recall@N_db
            (everything retrieved; :func:`ks_beyond_database`).
        whitening: a fitted :class:`~aggzoo.evaluation.postprocess.PCAWhitening` applied to both
            descriptor sets before the search (fit it on training images, never on the benchmark).
        rerank: e.g. :class:`~aggzoo.evaluation.postprocess.SuperGlobalRerank`; the search then
            returns at least its ``top_m`` candidates.
        keep_descriptors: store both descriptor matrices in the result (to save or reuse them).
        refine, refine_store: two-stage search (see :func:`search`). With ``refine_store="disk"`` the
            database descriptors are written to a memory-mapped ``<name>_database.npy`` (in ``dtype``) under
            ``store_dir`` (default a temporary folder, removed afterwards) and never held in RAM whole.
        index: as in :func:`search`; a FAISS binary index (``"BFlat"``) shortlists by the Hamming distance of
            the model's binary codes (:class:`BinaryCodes`, extracted with the float descriptors in the same pass:
            the store file then holds ``[N, D + bits]``, the codes last), and ``refine`` (required) candidates are
            re-scored by the float descriptors (SelaVPR++: ``refine=100``).
        progress: tqdm bars over the extraction batches (``None``: only on a terminal).
        extractor: what extracts the descriptors, called as :func:`extract_descriptors` (the default), e.g.
            :class:`aggzoo.training.sharded_extraction.ShardedExtractor` (sharded across DDP ranks).
        metric: the search metric (:func:`search`); SuperGlobal's re-ranking scores by inner products
            and is refused with ``"l2"`` (:func:`rerank_metric_check`).

    See :func:`extract_descriptors` (``batch_size``, ``num_workers``, ``device``, ``dtype``,
    ``autocast_dtype``) and :func:`search` (``index``, ``search_params``, ``use_gpu``) for the others.
    """
    rerank_metric_check(rerank, metric)
    batch_record = batch_dependence_record(model, batch_size, name=retrieval_set.name)
    hashing = BinaryCodes(model, with_descriptors=True) if is_binary_index(index) else None
    if hashing is not None and refine is None:
        raise ConfigError(binary_refine_message(index))
    start = time.perf_counter()
    extract = dict(batch_size=batch_size, num_workers=num_workers, device=device, dtype=dtype,
                   autocast_dtype=autocast_dtype, progress=progress)
    on_disk = refine is not None and refine_store == "disk"
    with tempfile.TemporaryDirectory(prefix="aggzoo-store-") as tmp:
        folder = Path(store_dir if store_dir is not None else tmp)
        if on_disk:
            folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{retrieval_set.name}_database.npy" if on_disk else None
        extract_fn = extractor if extractor is not None else extract_descriptors
        # with a binary first stage, one pass gives each image's float descriptor and its codes side by side
        # (exact in any float dtype: +-1), split afterwards; the store file then holds both
        net = hashing if hashing is not None else model
        database = extract_fn(net, retrieval_set.database_paths, transform, out_path=path,
                              desc=f"{retrieval_set.name} database", **extract)
        queries = extract_fn(net, retrieval_set.query_paths, transform,
                             desc=f"{retrieval_set.name} queries", **extract)
        codes = None
        if hashing is not None:
            (database, database_codes), (queries, query_codes) = hashing.split(database), hashing.split(queries)
            codes = (database_codes, query_codes)
        if whitening is not None:
            queries = whitening(queries)
            database = _map_rows(whitening, database, folder / f"{retrieval_set.name}_database_whitened.npy" if on_disk else None)
        extracted = time.perf_counter()
        k = min(max(max(ks), rerank.top_m if rerank is not None else 0), retrieval_set.num_database)
        predictions = search(database, queries, k, index=index, search_params=search_params, use_gpu=use_gpu,
                             refine=refine, refine_store=refine_store, codes=codes, metric=metric)
        if rerank is not None:
            predictions = rerank(database, queries, predictions,
                                 device=device if device is not None else _model_device(model))
        searched = time.perf_counter()
        if keep_descriptors and on_disk and store_dir is None:
            database = np.array(database)  # the temporary file goes away
        elif not keep_descriptors:
            del database
    return result_from_predictions(
        retrieval_set, predictions, ks, descriptor_dim=queries.shape[1],
        extraction_seconds=extracted - start, search_seconds=searched - extracted,
        database_descriptors=database if keep_descriptors else None,
        query_descriptors=queries if keep_descriptors else None,
        extras=batch_record,
    )


def rerank_metric_check(rerank: Any, metric: str) -> None:
    """Refuse a re-ranker that scores by inner products (SuperGlobal) after an L2 search: it would
    re-order the L2 shortlist by another metric. Re-rankers that score something else (instance tokens,
    local-feature matches) take any shortlist."""
    if check_metric(metric) == "l2" and isinstance(rerank, SuperGlobalRerank):
        raise ConfigError("evaluation.rerank=superglobal re-scores the shortlist by inner products of the global "
                          "descriptors, but evaluation.metric=l2 ranks by L2 distance: set evaluation.metric=ip, or "
                          "drop the re-ranking (evaluation.rerank=null)")


def _map_rows(fn: Callable[[np.ndarray], np.ndarray], rows: np.ndarray, out_path: Path | None,
              chunk: int = 65536) -> np.ndarray:
    """``fn`` applied to ``rows`` a chunk at a time, into RAM or a memory-mapped ``.npy`` at ``out_path``."""
    if out_path is None:
        return fn(rows)
    out: np.ndarray | None = None
    for part in _chunks(len(rows), chunk):
        mapped = fn(np.asarray(rows[part]))
        if out is None:
            out = np.lib.format.open_memmap(out_path, mode="w+", dtype=rows.dtype, shape=(len(rows), mapped.shape[1]))
        out[part] = mapped
    assert out is not None
    out.flush()
    return out


def result_from_predictions(
    retrieval_set: RetrievalSet, predictions: np.ndarray, ks: Sequence[int] = DEFAULT_KS, **fields: Any
) -> RetrievalResult:
    """A :class:`RetrievalResult` from ranked predictions (e.g. computed elsewhere or re-ranked)."""
    positives = retrieval_set.positives
    return RetrievalResult(
        name=retrieval_set.name,
        recalls=recall_at_k(predictions, positives, ks, num_database=retrieval_set.num_database),
        num_queries=retrieval_set.num_queries,
        num_database=retrieval_set.num_database,
        queries_without_positive=retrieval_set.queries_without_positive,
        predictions=predictions,
        curve=recall_curve(predictions, positives),
        retrieval_set=retrieval_set,
        **fields,
    )
