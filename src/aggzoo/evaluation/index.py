"""FAISS indexes of descriptors: exact, approximate, and two-stage (an approximate shortlist re-scored exactly).

Every index is built for the search metric asked (:data:`aggzoo.evaluation.options.METRICS`: ``"ip"``, inner
product; ``"l2"``, squared L2 distance as ``faiss.IndexFlatL2``). On unit-norm descriptors the two rank alike;
on descriptors that are not unit-norm (the dVGL benchmark's GeM with ``l2=before_pool``, a PCA projection
without a final L2) they differ, and the model's protocol says which one its figures used.

Large databases: an approximate FAISS index (IVF-PQ, HNSW, binary codes...) can be the first of two stages
(``refine=M``): it returns a shortlist of ``M`` candidates per query, which the second stage re-scores exactly
against the full-precision descriptors (:class:`TwoStageIndex`). Those live either in RAM inside FAISS's
``IndexRefineFlat`` (``refine_store="ram"``), or on disk in a memory-mapped ``.npy`` file
(``refine_store="disk"``, float16 or float32), so that RAM holds only the codes.

A binary first stage over a model's *second* descriptor (SelaVPR++: a hashing branch beside the float
descriptor) is the same two-stage search: ``index`` names a FAISS binary index (``"BFlat"``, exhaustive
Hamming; ``"BHNSW32"``...), built over the database's packed codes
(:func:`aggzoo.evaluation.binary_codes.pack_codes`), and its Hamming shortlist of ``refine`` candidates is
re-scored exactly against the float descriptors as any other shortlist.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from aggzoo.errors import ConfigError
from aggzoo.evaluation.options import SearchOptions, check_metric

try:  # FAISS is an optional dependency (extras cpu / gpu); torch covers exact search without it.
    import faiss
except ImportError:  # pragma: no cover - exercised only where faiss is not installed
    faiss = None

__all__ = ["TwoStageIndex", "binary_refine_message", "build_index", "faiss_available", "is_binary_index",
           "metric_of", "as_float32", "row_chunks"]


def faiss_available() -> bool:
    """Whether FAISS is installed (without it, exact search runs in torch)."""
    return faiss is not None



def _faiss_metric(metric: str) -> int:
    return faiss.METRIC_L2 if check_metric(metric) == "l2" else faiss.METRIC_INNER_PRODUCT


def metric_of(index: Any) -> str:
    """The metric a built index (FAISS or :class:`TwoStageIndex`) ranks by."""
    if isinstance(index, TwoStageIndex):
        return index.metric
    return "l2" if index.metric_type == faiss.METRIC_L2 else "ip"



_BINARY_FACTORY = re.compile(r"B(Flat|IVF\d|HNSW\d|Hash\d|MIHash\d)")


def is_binary_index(index: Any) -> bool:
    """Whether ``index`` names a FAISS binary index (``index_binary_factory``: ``"BFlat"``, ``"BHNSW32"``,
    ``"BIVF1024"``...): a first stage over a model's binary codes, not over its float descriptors."""
    return isinstance(index, str) and _BINARY_FACTORY.match(index.replace(" ", "")) is not None



def binary_refine_message(index: Any) -> str:
    """What a binary first stage (``evaluation.search.index=BFlat``...) without ``evaluation.search.refine`` is told."""
    return (f"evaluation.search.index={index} is a binary first stage: give the shortlist its Hamming search returns for "
            "the float descriptors to re-score, evaluation.search.refine=100 (SelaVPR++'s protocol)")


def as_float32(x: np.ndarray) -> np.ndarray:
    """``x`` as a C-contiguous float32 array (what FAISS takes), copied only when it is not one already."""
    return np.ascontiguousarray(x, dtype=np.float32)


def row_chunks(n: int, size: int) -> Sequence[slice]:
    """Slices of ``size`` rows covering ``range(n)``, in order: float16 or memory-mapped rows are converted
    one chunk at a time."""
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
        return base.search(as_float32(queries), m)[1]

    def search(self, queries: np.ndarray, k: int,
               first_queries: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        queries = as_float32(queries)
        if not self.binary and self.vectors is None:  # FAISS's IndexRefineFlat re-scores its own shortlist
            m = min(max(self.shortlist, k), self.ntotal)
            params = faiss.IndexRefineSearchParameters()
            params.k_factor = (m + 0.5) / k  # FAISS truncates k * k_factor: exactly m candidates
            # faiss.contrib.torch_utils (imported by pytorch-metric-learning's AccuracyCalculator) replaces
            # Index.search with a wrapper that takes no ``params``; the numpy original stays as search_numpy.
            search = getattr(self.first, "search_numpy", self.first.search)
            return search(queries, k, params=params)
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
    for part in row_chunks(num_queries, step):
        ids = candidates[part].astype(np.int64, copy=False)
        valid = ids >= 0
        rows, inverse = np.unique(np.where(valid, ids, 0), return_inverse=True)
        block = as_float32(vectors[rows])                                      # [U, D]
        local = np.ascontiguousarray(inverse.reshape(ids.shape), dtype=np.int64)  # [q, M] rows of block
        q = as_float32(queries[part])
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


def build_index(database: np.ndarray, options: SearchOptions = SearchOptions(), *,
                codes: np.ndarray | None = None) -> Any:
    """A FAISS index holding ``database`` ``[N, D]`` (trained first when the type needs it), of the type,
    metric, parameters and two-stage store of ``options``.

    Build once and pass the result as ``prebuilt=`` to :func:`aggzoo.evaluation.search.search` to query it
    several times. Index types without a GPU version (HNSW, flat SQ) stay on the CPU even when
    ``options.use_gpu`` asks for the GPU; two-stage indexes (``options.refine``) always do. With ``refine``
    the result is a :class:`TwoStageIndex`; with ``codes`` (the database's ``[N, bits / 8]`` packed binary
    codes, :func:`aggzoo.evaluation.binary_codes.pack_codes`) and a binary ``index`` its first stage is that
    binary index over them.
    """
    if faiss is None:
        raise ImportError("build_index needs faiss: pip install 'aggzoo[cpu]' (or [gpu])")
    index, metric, refine = options.index, options.metric, options.refine
    wanted = _faiss_metric(metric)
    database = np.asarray(database) if not isinstance(database, np.memmap) else database
    if is_binary_index(index) or codes is not None:
        return _binary_two_stage(database, codes, options)
    try:
        base = faiss.index_factory(database.shape[1], index, wanted)
    except RuntimeError as error:
        if "METRIC_L2" not in str(error) or wanted == faiss.METRIC_L2:
            raise
        base = faiss.index_factory(database.shape[1], index, faiss.METRIC_L2)  # LSH: refused below or shortlists
    if base.metric_type != wanted and not (options.on_disk and metric == "ip"):
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
    if refine is not None and options.refine_store == "ram":
        cpu_index = faiss.IndexRefineFlat(base)  # FAISS's Python wrapper keeps `base` referenced
    use_gpu = options.use_gpu
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
        built.train(as_float32(database[_training_rows(len(database), options.train_size, options.seed)]))
    for part in row_chunks(len(database), 65536):  # float16 storage stays float16 outside one chunk
        built.add(as_float32(database[part]))
    if options.search_params:
        on_gpu = built is not cpu_index
        # On an IndexRefine, ParameterSpace passes nprobe / efSearch on to the first-stage index.
        (faiss.GpuParameterSpace() if on_gpu else faiss.ParameterSpace()).set_index_parameters(built, options.search_params)
    if refine is not None:
        return TwoStageIndex(built, refine, vectors=database if options.on_disk else None, metric=metric)
    return built


def _training_rows(n: int, train_size: int | None, seed: int) -> np.ndarray:
    """Sorted rows an index trains on: all ``n``, or ``train_size`` of them drawn without replacement."""
    size = n if train_size is None else min(train_size, n)
    return np.sort(np.random.default_rng(seed).choice(n, size=size, replace=False))


def _binary_two_stage(database: np.ndarray, codes: np.ndarray | None, options: SearchOptions) -> TwoStageIndex:
    """A :class:`TwoStageIndex` whose first stage is the binary index ``options.index`` over ``codes``."""
    index, refine = options.index, options.refine
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
        first.train(codes[_training_rows(len(codes), options.train_size, options.seed)])
    first.add(codes)
    if options.search_params:
        for item in str(options.search_params).split(","):
            name, _, value = item.partition("=")
            target = faiss.downcast_IndexBinary(first)
            if name.strip() == "efSearch" and hasattr(target, "hnsw"):
                target.hnsw.efSearch = int(value)
            elif name.strip() == "nprobe" and hasattr(target, "nprobe"):
                target.nprobe = int(value)
            else:
                raise ValueError(f"search parameter {item!r} does not apply to the binary index {index!r}")
    return TwoStageIndex(first, refine, vectors=database, metric=options.metric)

