"""Evaluation at scale: extraction throughput, and search time / memory / recall versus database size.

    python benchmarks/eval_scale.py                                  # default, a few minutes on 2 CPU cores
    python benchmarks/eval_scale.py --sizes 1000,10000,100000,1000000 --dims 512,2048,4096 --max-cells 5000000000
    python benchmarks/eval_scale.py --skip-extraction --indexes Flat,HNSW32,IVFPQfs --hnsw-ef 512 --nprobe 64
    python benchmarks/eval_scale.py --skip-extraction --skip-search --two-stage-sizes 1000000 --stores disk \
        --two-stage-indexes PQfs32,PQfs16 --refine 32,64,100  # the 1M x 1024 two-stage rows (~9 GB RAM, ~8 min)
    python benchmarks/eval_scale.py --skip-search --skip-two-stage --repeats 5 --workers auto,0 \
        --extraction-variants fp32,channels_last,bf16 --precision-model netvlad_efficientnet_lite0.synthetic

Extraction: a real model (``--backbone``, default the ImageNet EfficientNet-Lite0 at 224x224) on
``--images`` synthetic JPEGs (480x640, written to a temporary folder), through
:func:`aggzoo.evaluation.extraction.extract_descriptors` (read -> resize -> normalise -> forward; ``--workers``
counts its DataLoader workers, ``auto`` its default, :func:`aggzoo.data.workers.loader_workers`), images/s,
median of ``--repeats`` rounds after a warm-up; the baseline, measured in the same rounds, is a true lower
bound: the forward pass alone on the very batches the pipeline builds (same images, dtype, memory format
and batch sizes), decoded beforehand, under the same eval and inference modes, descriptors copied to
NumPy as the pipeline does -- so the ratio is the cost of reading and resizing. Each round times the
forward and then every pipeline once, and the ratio is the median of the rounds' ratios (a shared machine's
speed drifts by several per cent over a minute; timing all forwards before all pipelines put that drift
into the ratio). (It used to run on
``torch.rand`` batches: other values, an untimed warm-up only for itself; it came out slower than the
pipeline it bounds.) Each ``--extraction-variants`` entry (``fp32``, ``channels_last``, ``bf16`` / ``fp16``
autocast) is timed with its own forward-only baseline; ``--precision-model`` adds the recall of
``eval.py ckpt_path=<model> evaluation.precision=<p>`` on the synthetic benchmark for each ``--precisions``.

Search: synthetic L2-normalised descriptors that look like VPR data: places grouped in look-alike
neighbourhoods (clusters of ~30), each query a noisy view of one database image (its positive, cosine
~0.48 at every D). For
each database size ``N`` and dimension ``D``, every index type is built with
:func:`aggzoo.evaluation.index.build_index` and queried with :func:`search` (k = 10):

- ``Flat``: exact inner product (the default); ``SQfp16``: the same, database stored in float16;
- ``HNSW32`` with efSearch 128;
- ``IVFPQ``: ``IVF<nlist>,PQ<m>`` with nlist ~ 4 sqrt(N) (at most N/39), m = D/8 bytes per vector (at most
  256), nprobe 16; ``IVFPQfs``: the same lists with 4-bit fast-scan PQ, D/4 bytes per vector. Both trained
  on at most 10k sampled rows.

Columns: build time (training + adding), search time per query (median of ``--repeats``), speed-up over
Flat in the same run, index memory (bytes the index holds: ``ntotal x code_size`` for flat indexes,
the serialised size otherwise — codes, centroids, graph links), Recall@1/@10 against the positives, and
the fraction of queries whose top-1 equals exact search's. The process's peak RSS is printed at the end.

Two-stage search (``--two-stage-*``, issue 12): :func:`search` with ``refine=M``: a first stage
(``IVFPQ``: D/8-byte codes; ``IVFPQfs``: 4-bit fast scan, D/16 bytes; ~sqrt(N) lists, trained on 64 rows
per list by default; exhaustive, no lists: ``PQfs`` / ``PQfs16`` / ``PQfs32`` / ``PQfs64`` 4-bit fast-scan PQ
of D/8, D/16, D/32 or D/64 bytes,
``ITQ`` / ``ITQ512`` 256- / 512-bit binary codes searched by Hamming distance) returns M candidates,
re-scored exactly against the full-precision database, memory-mapped from a ``--store-dtype`` ``.npy``
file (``disk``: RAM holds only the codes) or inside FAISS's IndexRefineFlat (``ram``: a float32 copy).
One build is searched at each ``--two-stage-nprobe`` and each ``--refine`` M. RAM = the serialised
first-stage index (codes, ids, centroids, rotations; plus the float32 copy of the ``ram`` store); not
counted: the mapped file's pages and the re-scoring's transient block (<= 64 MB per chunk of queries). The table ends with
the configurations within 0.5 R@1 of Flat, >= 10x faster per query and holding <= 1/8 of Flat's bytes.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _timing import interleaved_seconds, median_seconds, round_ratios, write_random_jpegs

from aggzoo.evaluation.index import build_index
from aggzoo.evaluation.metrics import recall_at_k
from aggzoo.evaluation.options import SearchOptions
from aggzoo.evaluation.search import search

K = 10
#: rows sampled to train IVF/PQ indexes (PQ's cost stops growing with N here)
TRAIN_ROWS = 10_000


# ------------------------------------------------------------------------------------------- extraction


def _extraction_row(name: str, rate: float, ratio: float, spread: str) -> str:
    """One line of the extraction table; ``spread``: the lowest and highest of the rounds' ratios."""
    return f"{name:<50} {rate:>9.1f} {ratio:>10.2f}x {spread:>10}"


def extraction_table(backbone: str, image_size: int, num_images: int, batch_size: int, repeats: int,
                     workers: Sequence[int | None] = (0, None), variants: Sequence[str] = ("fp32",)) -> str:
    """Images/s of :func:`extract_descriptors` against the bare forward, per variant (``fp32``,
    ``channels_last``, ``bf16``, ``fp16``: autocast dtype / memory format), each pipeline row against the
    forward of its own variant measured in the same run."""
    import torch
    from torch.utils.data import DataLoader

    from aggzoo.data.retrieval_set import ImageListDataset
    from aggzoo.data.transforms import eval_transform
    from aggzoo.data.workers import loader_workers
    from aggzoo.evaluation.extraction import extract_descriptors
    from aggzoo.evaluation.options import PRECISIONS, ExtractionOptions
    from aggzoo.models.backbones.timm_backbone import TimmBackbone
    from aggzoo.models.heads.gem import GeM
    from aggzoo.models.modes import evaluating
    from aggzoo.models.vpr_model import VPRModel

    model = VPRModel(TimmBackbone(backbone, pretrained=backbone == "tf_efficientnet_lite0"), GeM).eval()
    transform = eval_transform((image_size, image_size))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_random_jpegs(tmp, num_images)
        decoded = [images for images, _ in DataLoader(ImageListDataset(paths, transform), batch_size=batch_size)]
        for variant in variants:
            channels_last = variant == "channels_last"
            autocast = PRECISIONS.get(variant)
            memory_format = torch.channels_last if channels_last else torch.contiguous_format
            # The lower bound: the very batches the pipeline feeds the model (same images, dtype, memory
            # format and batch sizes), decoded beforehand, under the same eval mode, inference mode and
            # autocast, with the same copy of the descriptors to NumPy -- everything but reading and resizing.
            batches = [images.contiguous(memory_format=memory_format) for images in decoded]

            def forward_only(batches=batches, autocast=autocast, memory_format=memory_format) -> None:
                model.to(memory_format=memory_format)
                try:
                    with evaluating(model), torch.inference_mode(), torch.autocast(
                            "cpu", dtype=autocast, enabled=autocast is not None):
                        for images in batches:
                            model(images).float().cpu().numpy()
                finally:
                    model.to(memory_format=torch.contiguous_format)

            pipelines = {n_workers: functools.partial(
                extract_descriptors, model, paths, transform, ExtractionOptions(
                    batch_size=batch_size, num_workers=n_workers, precision=variant if variant in PRECISIONS else "fp32",
                    channels_last=channels_last, progress=False)) for n_workers in workers}
            # rounds of (forward, each pipeline): the ratio is the median of the per-round ratios, so that the
            # machine's drift between rounds cancels (timing all forwards first and then all pipelines did not)
            times = interleaved_seconds({"forward": forward_only, **pipelines}, repeats)
            forward_rate = num_images / statistics.median(times["forward"])
            rows.append((f"{variant}: forward only (decoded batches)", forward_rate, 1.0, ""))
            for n_workers in workers:
                rate = num_images / statistics.median(times[n_workers])
                ratios = round_ratios(times, "forward", n_workers)
                ratio = statistics.median(ratios)
                spread = f"{ratios[0]:.2f}-{ratios[-1]:.2f}" if len(ratios) > 1 else ""
                label = f"{n_workers} workers" if n_workers is not None else \
                    f"default workers ({loader_workers(None, num_images)})"
                rows.append((f"{variant}: extract_descriptors, {label}", rate, ratio, spread))
            for row in rows[-1 - len(workers):]:  # progress of long runs
                print(_extraction_row(*row), file=sys.stderr, flush=True)
    out = [f"Extraction: {backbone} + GeM at {image_size}x{image_size}, batch {batch_size}, {num_images} JPEGs "
           f"480x640, torch threads {torch.get_num_threads()}; {repeats} interleaved rounds after a warm-up, "
           "median images/s; vs forward: the median of the rounds' ratios to the forward of the same variant",
           f"{'pipeline':<50} {'images/s':>9} {'vs forward':>11} {'rounds':>10}"]
    out += [_extraction_row(*row) for row in rows]
    return "\n".join(out)


def precision_table(model_name: str, precisions: Sequence[str], benchmark: str = "synthetic_test") -> str:
    """Recall of ``python eval.py ckpt_path=<model_name> evaluation.precision=<p>`` for each precision,
    run in this process through the real pipeline (Hydra composition, the benchmark loader, FAISS)."""
    from aggzoo.run.evaluate import evaluate
    from aggzoo.run.pipeline import compose_run_config

    root = Path(__file__).resolve().parents[1]
    rows = []
    for precision in precisions:
        with tempfile.TemporaryDirectory() as tmp:
            cfg = compose_run_config(root / "conf", "eval", [
                f"ckpt_path={model_name}", f"benchmark=[{benchmark}]", f"evaluation.extraction.precision={precision}",
                "evaluation.outputs.pictures=false", "check_images=none"], tmp)
            start = time.perf_counter()
            (result,) = evaluate(cfg)
            rows.append((precision, result.recalls, result.extraction_seconds, time.perf_counter() - start))
    base = rows[0][1]
    ks = list(base)
    out = [f"Precision: {model_name} on {benchmark} (python eval.py ckpt_path={model_name} "
           f"evaluation.precision=...), recall change against {rows[0][0]}",
           f"{'precision':<10} " + " ".join(f"{f'R@{k}':>7}" for k in ks) + f" {'dR@1':>6} {'extract s':>10}"]
    for precision, recalls, extract_s, _ in rows:
        out.append(f"{precision:<10} " + " ".join(f"{100 * recalls[k]:>7.2f}" for k in ks)
                   + f" {100 * (recalls[ks[0]] - base[ks[0]]):>+6.2f} {extract_s:>10.1f}")
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------- search


def synthetic(n: int, d: int, n_queries: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """``[n, d]`` database, ``[q, d]`` queries (float32, unit rows), one positive per query."""
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((max(1, n // 30), d), dtype=np.float32)
    db = np.empty((n, d), dtype=np.float32)
    for start in range(0, n, 65536):  # float32 chunks: no float64 copy of a large database
        stop = min(n, start + 65536)
        block = centers[rng.integers(0, len(centers), stop - start)]
        block += 0.35 * rng.standard_normal((stop - start, d), dtype=np.float32)
        db[start:stop] = block / np.linalg.norm(block, axis=1, keepdims=True)
    source = rng.choice(n, n_queries, replace=n_queries > n)
    # Noise of norm ~1.8 whatever D (0.08 per coordinate at D = 512): a query's cosine to its positive
    # stays ~0.48, as in real VPR data, instead of falling as 1/sqrt(D) (0.36 at 1024, 0.19 at 4096).
    noise = np.float32(0.08 * np.sqrt(512 / d))
    queries = db[source] + noise * rng.standard_normal((n_queries, d), dtype=np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    return db, queries, [np.array([s]) for s in source]


def _divisor_at_most(d: int, m: int) -> int:
    m = max(1, min(m, d))
    while d % m:
        m -= 1
    return m


def index_specs(n: int, d: int, hnsw_ef: int = 128, nprobe: int = 16) -> dict[str, tuple[str, str | None]]:
    nlist = int(2 ** round(np.log2(4 * np.sqrt(n))))
    nlist = max(1, min(nlist, n // 39))
    return {
        "Flat": ("Flat", None),
        "SQfp16": ("SQfp16", None),
        "HNSW32": ("HNSW32", f"efSearch={hnsw_ef}"),
        # 8-bit PQ, D/8 bytes per vector (32x smaller than float32)
        "IVFPQ": (f"IVF{nlist},PQ{_divisor_at_most(d, min(d // 8, 256))}", f"nprobe={nprobe}"),
        # 4-bit fast-scan PQ, D/4 bytes per vector (16x smaller), cheap to train
        "IVFPQfs": (f"IVF{nlist},PQ{_divisor_at_most(d, min(d // 2, 1024))}x4fs", f"nprobe={nprobe}"),
    }


def index_bytes(index: object) -> int:
    import faiss

    inner = faiss.downcast_index(index)
    if type(inner).__name__ in ("IndexFlat", "IndexFlatIP", "IndexScalarQuantizer"):
        return int(inner.ntotal * inner.code_size)
    return int(faiss.serialize_index(index).nbytes)


def search_table(sizes: Sequence[int], dims: Sequence[int], n_queries: int, indexes: Sequence[str],
                 repeats: int, hnsw_ef: int = 128, nprobe: int = 16) -> str:
    header = (f"{'N':>9} {'D':>5} {'index':<16} {'build s':>8} {'ms/query':>9} {'vs Flat':>8} {'index MB':>9} "
              f"{'R@1':>6} {'R@10':>6} {'top1=exact':>10}")
    lines = [f"Search: {n_queries} queries, k = {K}, synthetic clustered descriptors, HNSW efSearch {hnsw_ef}, "
             f"IVF nprobe {nprobe}; medians of {repeats}", header,
             "-" * len(header)]
    for d in dims:
        for n in sizes:
            db, q, positives = synthetic(n, d, n_queries)
            exact_top1: np.ndarray | None = None
            flat_ms: float | None = None
            for name in indexes:
                spec, params = index_specs(n, d, hnsw_ef, nprobe)[name]
                stored = db.astype(np.float16) if name == "SQfp16" else db
                start = time.perf_counter()
                built = build_index(stored, SearchOptions(index=spec, search_params=params, train_size=TRAIN_ROWS))
                build_s = time.perf_counter() - start
                predictions = search(stored, q, K, prebuilt=built)
                seconds = median_seconds(functools.partial(search, stored, q, K, prebuilt=built), repeats, warmup=False)
                ms = 1000 * seconds / n_queries
                recalls = recall_at_k(predictions, positives, (1, K))
                if name == "Flat":
                    exact_top1, flat_ms = predictions[:, 0], ms
                agree = float(np.mean(predictions[:, 0] == exact_top1)) if exact_top1 is not None else float("nan")
                ratio = f"{flat_ms / ms:>7.1f}x" if flat_ms else f"{'-':>8}"
                lines.append(f"{n:>9} {d:>5} {spec:<16} {build_s:>8.2f} {ms:>9.4f} {ratio} "
                             f"{index_bytes(built) / 2**20:>9.1f} {100 * recalls[1]:>6.1f} {100 * recalls[K]:>6.1f} "
                             f"{100 * agree:>9.1f}%")
                del built
            del db, q
    return "\n".join(lines)


# -------------------------------------------------------------------------------------------- two-stage


def two_stage_nlist(n: int, nlist: int | None = None) -> int:
    """IVF lists of the two-stage table: ~sqrt(N), so that k-means trains in seconds on 2 cores."""
    return nlist or max(1, min(int(2 ** round(np.log2(np.sqrt(n)))), n // 39))


def two_stage_specs(n: int, d: int, nlist: int | None = None) -> dict[str, str]:
    """First-stage factory strings: IVF lists with PQ codes of D/8 bytes (8-bit) or D/16 bytes (4-bit
    fast scan: cheap to scan, the second stage makes up for the coarser codes), or an IVF whose
    centroids are searched with HNSW, D/8-byte PQ codes (FAISS builds HNSW over PQ codes with L2 only)."""
    nlist = two_stage_nlist(n, nlist)
    return {
        "IVFPQ": f"IVF{nlist},PQ{_divisor_at_most(d, min(d // 8, 256))}",
        "IVFPQfs": f"IVF{nlist},PQ{_divisor_at_most(d, min(d // 8, 1024))}x4fs",
        "IVFHNSWPQ": f"IVF{nlist}_HNSW32,PQ{_divisor_at_most(d, min(d // 8, 256))}",
        # No inverted lists: every code is scanned, so no query loses its positive to a list it did not
        # visit (on these clustered descriptors the IVF misses are list misses, not code errors).
        # 4-bit fast-scan PQ of D/4 sub-vectors (D/8 bytes) or D/8 sub-vectors (D/16 bytes):
        "PQfs": f"PQ{_divisor_at_most(d, d // 4)}x4fs",
        "PQfs16": f"PQ{_divisor_at_most(d, d // 8)}x4fs",
        # coarser still, D/32 or D/64 bytes: enough to find a query's look-alike neighbourhood, which the
        # exact second stage then ranks
        "PQfs32": f"PQ{_divisor_at_most(d, d // 16)}x4fs",
        "PQfs64": f"PQ{_divisor_at_most(d, d // 32)}x4fs",
        # binary codes searched by Hamming distance: min(256, D/2) bits (32 bytes) or min(512, D/2) (64 bytes)
        "ITQ": f"ITQ{min(256, d // 2)},LSHt",
        "ITQ512": f"ITQ{min(512, d // 2)},LSHt",
    }


def two_stage_table(sizes: Sequence[int], dims: Sequence[int], n_queries: int, configs: Sequence[str],
                    repeats: int, refines: Sequence[int], nprobes: Sequence[int], stores: Sequence[str], store_dtype: str,
                    store_dir: str | None, nlist: int | None = None, train_per_list: int = 64) -> str:
    """Flat against first stage + exact re-scoring of M candidates (``search(..., refine=M)``, each M of
    ``refines`` on the same build), the full-precision vectors in RAM (FAISS IndexRefineFlat) or
    memory-mapped from a .npy file."""
    import faiss

    header = (f"{'N':>9} {'D':>5} {'first stage':<22} {'nprobe':>6} {'M':>4} {'store':<6} {'build s':>8} {'ms/query':>9} "
              f"{'vs Flat':>8} {'RAM MB':>8} {'RAM/Flat':>8} {'disk MB':>8} {'R@1':>6} {'R@10':>6} {'top1=exact':>10}")
    lines = [f"Two-stage search: {n_queries} queries, k = {K}, shortlists M = {','.join(map(str, refines))}, "
             f"disk store {store_dtype} (memory-mapped .npy); medians of {repeats}.",
             "RAM = the serialised first-stage index: codes, ids, centroids, rotations (plus the float32 copy of "
             "the 'ram' store). Not counted: the mapped file's pages (the OS page cache) and the re-scoring's "
             "transient block (<= 64 MB per chunk of queries, freed after each chunk).",
             header, "-" * len(header)]
    verdicts = []
    for d in dims:
        for n in sizes:
            db, q, positives = synthetic(n, d, n_queries)
            with tempfile.TemporaryDirectory(dir=store_dir, prefix="aggzoo-eval-scale-") as tmp:
                path = Path(tmp) / "database.npy"
                mapped = np.lib.format.open_memmap(path, mode="w+", dtype=np.dtype(store_dtype), shape=db.shape)
                for part in range(0, n, 65536):
                    mapped[part:part + 65536] = db[part:part + 65536]
                mapped.flush()
                del mapped
                start = time.perf_counter()
                flat = build_index(db, SearchOptions(index="Flat"))
                flat_build = time.perf_counter() - start
                exact = search(db, q, K, prebuilt=flat)
                flat_s = median_seconds(functools.partial(search, db, q, K, prebuilt=flat), repeats, warmup=False)
                flat_ms = 1000 * flat_s / n_queries
                flat_bytes = index_bytes(flat)
                del flat
                flat_r = recall_at_k(exact, positives, (1, K))
                lines.append(f"{n:>9} {d:>5} {'Flat':<22} {'-':>6} {'-':>4} {'-':<6} {flat_build:>8.2f} {flat_ms:>9.4f} "
                             f"{'1.0x':>8} {flat_bytes / 2**20:>8.1f} {1.0:>8.3f} {'-':>8} {100 * flat_r[1]:>6.1f} "
                             f"{100 * flat_r[K]:>6.1f} {100.0:>9.1f}%")
                print(lines[-1], file=sys.stderr, flush=True)  # progress of long runs
                stored = np.load(path, mmap_mode="r")
                for name in configs:
                    spec = two_stage_specs(n, d, nlist)[name]
                    # IVF: enough rows per list for k-means; PQ / ITQ codes: TRAIN_ROWS is plenty
                    train_rows = min(n, max(TRAIN_ROWS, train_per_list * two_stage_nlist(n, nlist))
                                     if spec.startswith("IVF") else TRAIN_ROWS)
                    for store in stores:
                        if store == "ram" and name.startswith("ITQ"):
                            continue  # FAISS's binary codes are L2-only: IndexRefineFlat would rank backwards
                        source = db if store == "ram" else stored
                        start = time.perf_counter()
                        built = build_index(source, SearchOptions(index=spec, train_size=train_rows, refine=refines[0],
                                                                  refine_store=store))
                        build_s = time.perf_counter() - start
                        is_ivf = spec.startswith("IVF")
                        # one build, searched at each nprobe and shortlist size
                        for nprobe, refine in itertools.product(nprobes if is_ivf else ["-"], refines):
                            built.shortlist = refine
                            if is_ivf:
                                faiss.ParameterSpace().set_index_parameters(built.first, f"nprobe={nprobe}")
                            predictions = search(source, q, K, prebuilt=built)
                            seconds = median_seconds(functools.partial(search, source, q, K, prebuilt=built), repeats,
                                                     warmup=False)
                            ms = 1000 * seconds / n_queries
                            recalls = recall_at_k(predictions, positives, (1, K))
                            ram = built.ram_bytes()
                            disk = path.stat().st_size if store == "disk" else 0
                            agree = float(np.mean(predictions[:, 0] == exact[:, 0]))
                            lines.append(
                                f"{n:>9} {d:>5} {spec:<22} {nprobe:>6} {refine:>4} {store:<6} {build_s:>8.2f} "
                                f"{ms:>9.4f} {flat_ms / ms:>7.1f}x {ram / 2**20:>8.1f} {ram / flat_bytes:>8.3f} "
                                f"{(f'{disk / 2**20:.0f}' if disk else '-'):>8} {100 * recalls[1]:>6.1f} "
                                f"{100 * recalls[K]:>6.1f} {100 * agree:>9.1f}%", )
                            print(lines[-1], file=sys.stderr, flush=True)  # progress of long runs
                            ok = (100 * (flat_r[1] - recalls[1]) <= 0.5 and flat_ms / ms >= 10
                                  and ram <= flat_bytes / 8)
                            if ok:
                                verdicts.append(f"N={n} D={d}: {spec}, nprobe {nprobe}, M = {refine} ({store}): "
                                                f"R@1 {100 * recalls[1]:.1f} vs Flat {100 * flat_r[1]:.1f}, "
                                                f"{flat_ms / ms:.0f}x faster, RAM 1/{flat_bytes / ram:.0f} of Flat")
                        del built
                del stored
            del db, q
    lines.append("")
    lines.append("Within 0.5 R@1 of Flat, >= 10x faster per query and <= 1/8 of Flat's RAM:")
    lines += [f"  {v}" for v in verdicts] or ["  none"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000", help="database sizes N (comma-separated)")
    parser.add_argument("--dims", default="512", help="descriptor dimensions D")
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--indexes", default="Flat,SQfp16,HNSW32,IVFPQ")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-cells", type=int, default=10**8,
                        help="skip (N, D) pairs with N*D above this; raise it for big runs")
    parser.add_argument("--hnsw-ef", type=int, default=128, help="HNSW efSearch (recall vs speed)")
    parser.add_argument("--nprobe", type=int, default=16, help="IVF lists visited per query")
    parser.add_argument("--skip-extraction", action="store_true")
    parser.add_argument("--skip-search", action="store_true", help="skip the one-stage table")
    parser.add_argument("--skip-two-stage", action="store_true")
    parser.add_argument("--two-stage-sizes", default="100000", help="database sizes N of the two-stage table")
    parser.add_argument("--two-stage-dims", default="1024", help="descriptor dimensions D of the two-stage table")
    parser.add_argument("--two-stage-indexes", default="IVFPQfs,ITQ",
                        help="first stages: IVFPQ (D/8 bytes), IVFPQfs (4-bit fast scan, D/16 bytes), IVFHNSWPQ, "
                             "ITQ (binary codes, 32 bytes)")
    parser.add_argument("--refine", default="100", help="shortlist sizes M re-scored exactly (comma-separated)")
    parser.add_argument("--stores", default="disk,ram", help="where stage 2 reads full vectors: disk, ram")
    parser.add_argument("--store-dtype", default="float16", choices=["float16", "float32"])
    parser.add_argument("--store-dir", default=None, help="folder for the memory-mapped store (default: temp)")
    parser.add_argument("--two-stage-nprobe", default="32,128", help="IVF lists visited (comma-separated)")
    parser.add_argument("--nlist", type=int, default=None, help="IVF lists of the two-stage table (default ~sqrt N)")
    parser.add_argument("--train-per-list", type=int, default=64, help="two-stage IVF training rows per list")
    parser.add_argument("--backbone", default="tf_efficientnet_lite0")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", default="0,auto",
                        help="extraction DataLoader workers to time (comma-separated; auto: extract_descriptors' default)")
    parser.add_argument("--extraction-variants", default="fp32,channels_last",
                        help="extraction variants: fp32, channels_last, bf16, fp16 (autocast)")
    parser.add_argument("--precision-model", default=None,
                        help="a model name for ckpt_path= (e.g. netvlad_efficientnet_lite0.synthetic): the recall "
                             "of eval.py at each --precisions on the synthetic benchmark")
    parser.add_argument("--precisions", default="fp32,bf16,fp16", help="evaluation.precision values to compare")
    args = parser.parse_args(argv)

    if not args.skip_extraction:
        print(extraction_table(args.backbone, args.image_size, args.images, args.batch_size, args.repeats,
                               [None if w == "auto" else int(w) for w in args.workers.split(",")],
                               [v for v in args.extraction_variants.split(",") if v]), flush=True)
        print()
    if args.precision_model:
        print(precision_table(args.precision_model, [p for p in args.precisions.split(",") if p]), flush=True)
        print()
    sizes = [int(s) for s in args.sizes.split(",")]
    dims = [int(s) for s in args.dims.split(",")]
    indexes = [s for s in args.indexes.split(",") if s]
    for d in dims if not args.skip_search else ():
        kept = [n for n in sizes if n * d <= args.max_cells]
        if kept:
            print(search_table(kept, [d], args.queries, indexes, args.repeats, args.hnsw_ef, args.nprobe), flush=True)
            print()
    if not args.skip_two_stage:
        print(two_stage_table([int(s) for s in args.two_stage_sizes.split(",")],
                              [int(s) for s in args.two_stage_dims.split(",")], args.queries,
                              [s for s in args.two_stage_indexes.split(",") if s], args.repeats,
                              [int(m) for m in args.refine.split(",")],
                              [int(s) for s in args.two_stage_nprobe.split(",")],
                              [s for s in args.stores.split(",") if s], args.store_dtype,
                              args.store_dir, args.nlist, args.train_per_list), flush=True)
        print()
    print(f"process peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
