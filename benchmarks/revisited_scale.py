"""Revisited Oxford/Paris + 1M distractors at scale: mAP and search time of exact search against the two-stage
search (an approximate shortlist re-scored exactly from a memory-mapped float16 store).

    python benchmarks/revisited_scale.py --distractors 20000 --repeats 1        # a quick run (~1 min)
    python benchmarks/revisited_scale.py                                        # 1M x 2048: ~15 min on 2 cores, 4 GB on
                                                                                # disk, ~15 GB peak RSS with the mapped store
    python benchmarks/revisited_scale.py --configs PQfs32,IVFPQfs --refine 1000,5000 --nprobe 16,64

The data is synthetic but shaped like the revisited protocol at D = 2048, all rows L2-normalised:

- ``--landmarks`` landmarks (default 14) of 5 queries each (70, as RParis6k). A query has cosine ~0.85 to
  its landmark's centre; per landmark, 15-40 *easy* images (cosine 0.7-0.9 to the centre: ~0.68 to a
  query), 5-20 *junk* (0.5-0.7) and 15-40 *hard* ones (0.3-0.55: ~0.36 to a query, near the noise floor
  of the look-alikes below). The rest of the ``--landmark-db`` images (default 5000) are other buildings:
  200 background clusters, unrelated to any query.
- ``--distractors`` images (default 1,000,000), appended after the benchmark's own as the R1M list is:
  clusters of ~500 (``N / 500`` centres); ``--lookalike`` of the clusters (default 3%) are centred near a
  landmark (cosine 0.3-0.6 to its centre), so that their members score 0.15-0.48 against its queries and
  outrank many hard positives (Hard mAP well below Medium, as on R1M); the others are unrelated.

The ground truth is the protocol's: Medium = easy + hard positives, junk ignored; Hard = hard positives,
easy + junk ignored. mAP by :func:`aggzoo.evaluation.metrics.revisited.revisited_metrics`.

The database is generated in chunks (seeded) straight into a float16 ``.npy`` (the two-stage disk store,
memory-mapped); nothing else holds it whole except FAISS's ``Flat`` index (float32, N x D x 4 bytes: 8 GB at
1M x 2048). Rows:

- ``Flat (full ranking)``: exact inner-product search of every database row, the full ranking the protocol
  scores (``search(..., k=N)``, as :func:`aggzoo.evaluation.loop.search_depth` asks for mAP): the reference
  mAP and time. ``Flat top-K``: the same index, only the top K (K = the largest M): the cost of the
  exhaustive scoring alone; its mAP is over the top K only.
- two-stage: ``SearchOptions(index=<first stage>, refine=M, refine_store="disk")`` built over the float16
  store, each shortlist M of ``--refine`` on one build, searched to depth M (the loop's depth for a
  two-stage search): ``PQfs16`` / ``PQfs32``: exhaustive 4-bit fast-scan PQ of D/16 or D/32 bytes per vector;
  ``IVFPQfs``: ``IVF<nlist>,PQ<D/8>x4fs`` (D/16 bytes) at each ``--nprobe``.

Columns: Medium / Hard mAP (%), their change against Flat's full ranking, search ms per query (median of
``--repeats``, searches of all queries at once), the speed-up over the full ranking measured in the same run,
the speed-up over ``Flat top-K`` (exhaustive scoring without the full sort: the harder baseline), and bytes in
RAM (Flat: N x D x 4; two-stage: the serialised first stage -- codes, centroids; not counted: the mapped
store's pages in the OS file cache). The table ends with the configurations within 0.5 mAP
(Medium and Hard) of Flat at >= 10x less search time. Timings on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import functools
import resource
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _timing import median_seconds

from aggzoo.data.retrieval_set import GroundTruth
from aggzoo.evaluation.index import build_index
from aggzoo.evaluation.metrics.revisited import revisited_metrics
from aggzoo.evaluation.options import SearchOptions
from aggzoo.evaluation.search import search

QUERIES_PER_LANDMARK = 5
CHUNK = 32768  # rows generated at a time: 256 MB of float32 at D = 2048
TRAIN_ROWS = 20_000


@dataclass(frozen=True)
class Benchmark:
    """The synthetic benchmark: queries ``[Q, D]`` float32, the database in ``store`` (a float16 ``.npy``),
    and the Medium / Hard ground truths over its first ``num_landmark_db`` rows."""

    queries: np.ndarray
    store: Path
    setups: dict[str, GroundTruth]
    num_landmark_db: int


def _divisor_at_most(d: int, m: int) -> int:
    """The largest divisor of ``d`` not above ``m`` (PQ sub-vectors must split D evenly)."""
    m = max(1, min(m, d))
    while d % m:
        m -= 1
    return m


def _nlist(n: int) -> int:
    """IVF lists: ~sqrt(N), so that k-means trains in a minute on 2 cores."""
    return max(1, min(int(2 ** round(np.log2(np.sqrt(n)))), n // 39))


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _around(rng: np.random.Generator, centres: np.ndarray, cosines: np.ndarray) -> np.ndarray:
    """Unit rows at about ``cosines [n]`` to their ``centres [n, D]`` (unit): the centre plus independent
    Gaussian noise of norm ~1, which at large D is nearly orthogonal to everything."""
    d = centres.shape[1]
    noise = rng.standard_normal(centres.shape, dtype=np.float32) / np.float32(np.sqrt(d))
    c = cosines.astype(np.float32)[:, None]
    return _unit(c * centres + np.sqrt(1 - c * c) * noise).astype(np.float32)


def generate(folder: Path, dim: int, landmarks: int, landmark_db: int, distractors: int, lookalike: float,
             seed: int = 0) -> Benchmark:
    """Write the ``[landmark_db + distractors, dim]`` float16 database to ``folder/database.npy``."""
    rng = np.random.default_rng(seed)
    centres = _unit(rng.standard_normal((landmarks, dim), dtype=np.float32))
    owner = np.repeat(np.arange(landmarks), QUERIES_PER_LANDMARK)
    queries = _around(rng, centres[owner], rng.uniform(0.8, 0.9, len(owner)))
    rows, easy, hard, junk = [], [], [], []
    start = 0
    for lm in range(landmarks):
        kinds = {}
        for kind, count, low, high in (("easy", rng.integers(15, 41), 0.7, 0.9), ("junk", rng.integers(5, 21), 0.5, 0.7),
                                       ("hard", rng.integers(15, 41), 0.3, 0.55)):
            rows.append(_around(rng, np.repeat(centres[lm:lm + 1], count, 0), rng.uniform(low, high, count)))
            kinds[kind] = np.arange(start, start + count)
            start += count
        easy.append(kinds["easy"])
        hard.append(kinds["hard"])
        junk.append(kinds["junk"])
    if start > landmark_db:
        raise SystemExit(f"error: --landmark-db {landmark_db} is smaller than the {start} landmark images")
    background = _unit(rng.standard_normal((200, dim), dtype=np.float32))
    others = landmark_db - start
    rows.append(_around(rng, background[rng.integers(0, 200, others)], rng.uniform(0.5, 0.9, others)))
    per_query = lambda lists: tuple(lists[lm] for lm in owner)  # noqa: E731 - the 5 queries share a landmark
    setups = {
        "medium": GroundTruth(per_query([np.concatenate([e, h]) for e, h in zip(easy, hard)]), per_query(junk)),
        "hard": GroundTruth(per_query(hard), per_query([np.concatenate([e, j]) for e, j in zip(easy, junk)])),
    }
    n = landmark_db + distractors
    path = folder / "database.npy"
    store = np.lib.format.open_memmap(path, mode="w+", dtype=np.float16, shape=(n, dim))
    store[:landmark_db] = np.concatenate(rows)
    num_clusters = max(1, distractors // 500)
    cluster_centres = _unit(rng.standard_normal((num_clusters, dim), dtype=np.float32))
    near = rng.random(num_clusters) < lookalike
    targets = rng.integers(0, landmarks, num_clusters)
    cluster_centres[near] = _around(rng, centres[targets[near]], rng.uniform(0.3, 0.6, int(near.sum())))
    for part in range(0, distractors, CHUNK):
        count = min(CHUNK, distractors - part)
        members = rng.integers(0, num_clusters, count)
        block = _around(rng, cluster_centres[members], rng.uniform(0.6, 0.95, count))
        store[landmark_db + part:landmark_db + part + count] = block
    store.flush()
    del store
    return Benchmark(queries, path, setups, landmark_db)


def maps(predictions: np.ndarray, setups: dict[str, GroundTruth]) -> tuple[float, float]:
    """Medium and Hard mAP (%) of ``[Q, K]`` rankings."""
    scores = revisited_metrics(predictions, setups, ks=(1,))
    return 100 * scores["medium"]["map"], 100 * scores["hard"]["map"]


def first_stages(n: int, d: int) -> dict[str, str]:
    """First-stage factory strings (4-bit fast-scan PQ: cheap to scan; the exact second stage makes up for
    coarse codes)."""
    return {
        "PQfs16": f"PQ{_divisor_at_most(d, d // 8)}x4fs",     # D/16 bytes per vector
        "PQfs32": f"PQ{_divisor_at_most(d, d // 16)}x4fs",    # D/32 bytes
        "IVFPQfs": f"IVF{_nlist(n)},PQ{_divisor_at_most(d, d // 8)}x4fs",
    }


def _row(name: str, nprobe: object, m: object, medium: float, hard: float, ref: tuple[float, float] | None,
         ms: float, base_ms: tuple[float, float], ram: int) -> str:
    delta = f"{medium - ref[0]:>+7.2f} {hard - ref[1]:>+7.2f}" if ref else f"{'-':>7} {'-':>7}"
    return (f"{name:<26} {nprobe!s:>6} {m!s:>7} {medium:>7.2f} {hard:>7.2f} {delta} {ms:>9.2f} "
            f"{base_ms[0] / ms:>7.1f}x {base_ms[1] / ms:>7.1f}x {ram / 2**20:>9.1f}")


def table(args: argparse.Namespace) -> str:
    import faiss

    refines = [int(m) for m in args.refine.split(",")]
    nprobes = [int(p) for p in args.nprobe.split(",")]
    with tempfile.TemporaryDirectory(dir=args.store_dir, prefix="aggzoo-revisited-scale-") as tmp:
        start = time.perf_counter()
        bench = generate(Path(tmp), args.dim, args.landmarks, args.landmark_db, args.distractors, args.lookalike,
                         args.seed)
        store = np.load(bench.store, mmap_mode="r")
        n, q = len(store), len(bench.queries)
        print(f"generated {n} x {args.dim} in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
        header = (f"{'search':<26} {'nprobe':>6} {'M':>7} {'Medium':>7} {'Hard':>7} {'dMedium':>7} {'dHard':>7} "
                  f"{'ms/query':>9} {'speed-up':>8} {'vs top-K':>8} {'RAM MB':>9}")
        lines = [f"Revisited-style benchmark: {q} queries, {bench.num_landmark_db} landmark images + "
                 f"{args.distractors} distractors = {n} x {args.dim} (L2-normalised; two-stage store float16, "
                 f"memory-mapped); mAP %, medians of {args.repeats} searches of all queries; speed-up and d* "
                 "against Flat's full ranking in this run", header, "-" * len(header)]

        def emit(line: str) -> None:
            lines.append(line)
            print(line, file=sys.stderr, flush=True)  # progress of long runs

        start = time.perf_counter()
        flat = build_index(store, SearchOptions(index="Flat"))
        print(f"Flat built in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
        full = functools.partial(search, store, bench.queries, n, prebuilt=flat)
        exact = maps(full(), bench.setups)
        exact_ms = 1000 * median_seconds(full, args.repeats, warmup=False) / q
        flat_bytes = flat.ntotal * flat.code_size  # the float32 rows FAISS holds
        top = functools.partial(search, store, bench.queries, max(refines), prebuilt=flat)
        top_ms = 1000 * median_seconds(top, args.repeats) / q
        base = (exact_ms, top_ms)
        emit(_row("Flat (full ranking)", "-", n, *exact, None, exact_ms, base, flat_bytes))
        emit(_row(f"Flat top-{max(refines)}", "-", max(refines), *maps(top(), bench.setups), exact, top_ms, base,
                  flat_bytes))
        del flat, full, top
        verdicts = []
        for name in args.configs.split(","):
            spec = first_stages(n, args.dim)[name]
            is_ivf = spec.startswith("IVF")
            train = min(n, max(TRAIN_ROWS, 64 * _nlist(n)) if is_ivf else TRAIN_ROWS)
            start = time.perf_counter()
            built = build_index(store, SearchOptions(index=spec, refine=refines[0], refine_store="disk",
                                                     train_size=train, seed=args.seed))
            print(f"{spec} built in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
            for nprobe in nprobes if is_ivf else ["-"]:
                if is_ivf:
                    faiss.ParameterSpace().set_index_parameters(built.first, f"nprobe={nprobe}")
                for m in refines:
                    built.shortlist = m
                    run = functools.partial(search, store, bench.queries, m, prebuilt=built)
                    medium, hard = maps(run(), bench.setups)
                    ms = 1000 * median_seconds(run, args.repeats, warmup=False) / q
                    emit(_row(f"{spec} + disk", nprobe, m, medium, hard, exact, ms, base, built.ram_bytes()))
                    if max(exact[0] - medium, exact[1] - hard) <= 0.5 and exact_ms / ms >= 10:
                        verdicts.append(f"{spec}, nprobe {nprobe}, M = {m}: Medium {medium:.2f} / Hard {hard:.2f} "
                                        f"vs Flat {exact[0]:.2f} / {exact[1]:.2f}, {exact_ms / ms:.0f}x faster, "
                                        f"RAM 1/{flat_bytes / built.ram_bytes():.0f} of Flat")
            del built
        del store
    lines += ["", "Within 0.5 mAP (Medium and Hard) of Flat's full ranking at >= 10x less search time:"]
    lines += [f"  {v}" for v in verdicts] or ["  none"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--distractors", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=2048)
    parser.add_argument("--landmarks", type=int, default=14, help=f"{QUERIES_PER_LANDMARK} queries each")
    parser.add_argument("--landmark-db", type=int, default=5000, help="the benchmark's own database images")
    parser.add_argument("--lookalike", type=float, default=0.03, help="fraction of distractor clusters near a landmark")
    parser.add_argument("--configs", default="PQfs32,PQfs16,IVFPQfs", help="first stages: PQfs16, PQfs32, IVFPQfs")
    parser.add_argument("--refine", default="1000,2000,3000,10000", help="shortlists M re-scored exactly")
    parser.add_argument("--nprobe", default="32,128", help="IVF lists visited (IVFPQfs)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--store-dir", default=None, help="folder of the temporary float16 store (default: /tmp)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    import faiss

    print(f"faiss {faiss.__version__}, {faiss.omp_get_max_threads()} threads")
    print(table(args))
    print(f"process peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
