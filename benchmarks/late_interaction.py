"""Multi-vector re-ranking on real data: R@k before/after instance-token late interaction, storage, ms/query.

    python benchmarks/late_interaction.py                                  # nordland_mini, the shipped NetVLAD-Lite0
    python benchmarks/late_interaction.py --queries 40 --tokens 4,all --shortlists 20 --repeats 2   # a quick look

Data: ``<shared data>/nordland_mini/vg`` test split (1292 winter queries vs 1292 summer database images,
25 m = the same frame), ``--queries`` of them (the first ones, all database images). Model: ``--model``,
anything :func:`aggzoo.create_model` takes (default ``netvlad_efficientnet_lite0.nordland_mini``, the
shipped weights), at its recorded evaluation size and mean/std.

The backbone's last-map patch tokens are extracted once (``[N, T, C]``); for each ``K`` in ``--tokens`` the
instance tokens (:func:`aggzoo.evaluation.late_interaction.instance_tokens`, the same function
``evaluation.rerank=instance_tokens`` runs) are computed from them and stored float16, as the pipeline
stores them. The single-vector baseline is exact (``Flat``) search of the head's descriptor; each row
re-ranks its top-``M`` (``--shortlists``) by late interaction, and ``M = N`` rows score the whole database
by late interaction (the "full late interaction" the paper compares against; ``--full-tokens`` K values
only, timed once without warm-up: it is slow).

Columns: R@1/5/10 (%), bytes stored per database image (descriptor float32 or tokens float16), ms per
query (median of ``--repeats`` timed runs after a warm-up; re-ranking only for the token rows, the
Flat search for the baseline) and that time as a multiple of the baseline's search measured in the same
run. Extraction is not in the ms column; here descriptor and tokens come from one forward pass (the
pipeline's ``evaluation.rerank=instance_tokens`` runs a second pass over the images for the tokens).

Measured 2026-12-01 with the shipped file as retrained with weight ensembling (2 cores, other jobs
running), all 1292 queries, ``--tokens 1,4,8,16,all --shortlists 20,100 --repeats 3``: single vector R@1
34.37 (the manifest's figure); all 32 tokens (plain Chamfer), M=20: 40.63, M=100: 40.48, whole database:
40.40; K=16, M=20: 32.59; K=8: 18.81; K=4: 10.60; K=1: 12.31. Aggregation to K <= 16 tokens loses to the
single vector on this CNN's 4x8 map.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from _timing import median_seconds
from shared_paths import NORDLAND_MINI

from aggzoo import create_model
from aggzoo.data.transforms import eval_transform
from aggzoo.data.vg import load_vg
from aggzoo.evaluation.extraction import extract_descriptors
from aggzoo.evaluation.late_interaction import InstanceTokenRerank, instance_tokens, patch_tokens
from aggzoo.evaluation.metrics import recall_at_k
from aggzoo.evaluation.options import ExtractionOptions
from aggzoo.evaluation.search import search

KS = (1, 5, 10)


class _DescriptorAndTokens(torch.nn.Module):
    """``images -> [B, D + T*C]``: the head's descriptor and the raw last-map patch tokens of one forward
    pass, flattened side by side for the one extraction loop (this script splits them again)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.train(model.training)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = self.model.forward_features(images)
        return torch.cat([self.model.head(features), patch_tokens(features.last).flatten(1)], dim=1)


def _row(name: str, predictions: np.ndarray, positives, n_db: int, nbytes: int, ms: float, base_ms: float) -> str:
    recalls = recall_at_k(predictions, positives, KS, num_database=n_db)
    cells = " | ".join(f"{100 * recalls[k]:5.2f}" for k in KS)
    return f"| {name:<34} | {cells} | {nbytes:>9,} | {ms:8.3f} | {ms / base_ms:7.2f}x |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="netvlad_efficientnet_lite0.nordland_mini")
    parser.add_argument("--data", type=Path, default=NORDLAND_MINI / "vg")
    parser.add_argument("--queries", type=int, default=None, help="first Q queries (default all)")
    parser.add_argument("--tokens", default="1,2,4,8,16,all")
    parser.add_argument("--shortlists", default="20,100")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--full-tokens", default="16,all",
                        help="K values that also score the whole database by late interaction (timed once, no warm-up)")
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    if not args.data.is_dir():
        raise SystemExit(f"error: no nordland_mini at {args.data} (set AGGZOO_SHARED_DATA or pass --data)")

    rs = load_vg(args.data, split="test", positive_radius_m=25.0, name="nordland_mini")
    query_paths = rs.query_paths[: args.queries]
    positives = rs.positives[: len(query_paths)]
    model = create_model(args.model, pretrained=True).eval()
    cfg = model.pretrained_cfg  # the weights' recorded evaluation protocol (hub.cfg.PretrainedCfg)
    size = tuple(cfg.input_size[1:])
    transform = eval_transform(size, mean=tuple(cfg.mean), std=tuple(cfg.std))
    print(f"model {args.model}, input {size}, {len(query_paths)} queries x {rs.num_database} database images, "
          f"torch threads {torch.get_num_threads()}")

    start = time.perf_counter()
    both = _DescriptorAndTokens(model)
    db_all = extract_descriptors(both, rs.database_paths, transform, ExtractionOptions(batch_size=args.batch_size))
    q_all = extract_descriptors(both, query_paths, transform, ExtractionOptions(batch_size=args.batch_size))
    seconds = time.perf_counter() - start
    dim, channels = model.out_dim, model.backbone.out_channels
    db, q = np.ascontiguousarray(db_all[:, :dim]), np.ascontiguousarray(q_all[:, :dim])
    raw_db = torch.from_numpy(np.ascontiguousarray(db_all[:, dim:])).view(len(db_all), -1, channels)
    raw_q = torch.from_numpy(np.ascontiguousarray(q_all[:, dim:])).view(len(q_all), -1, channels)
    num_patches = raw_db.shape[1]
    print(f"extraction (descriptor + patch tokens, one pass): {seconds:.1f} s for {len(db) + len(q)} images; "
          f"descriptor {dim}-D, {num_patches} patch tokens of {channels}-D per image")

    n_db = rs.num_database
    widest = max(max(KS), *(int(m) for m in args.shortlists.split(",")))
    base_ms = 1000 * median_seconds(lambda: search(db, q, widest), args.repeats) / len(q)
    shortlist = search(db, q, n_db)  # the whole single-vector ranking: the first M are each row's shortlist
    lines = [
        "| configuration                      |   R@1 |   R@5 |  R@10 | bytes/img |  ms/query | vs Flat |",
        "|------------------------------------|-------|-------|-------|-----------|-----------|---------|",
        _row(f"single vector, Flat ({db.shape[1]}-D fp32)", shortlist[:, :widest], positives, n_db,
             4 * db.shape[1], base_ms, base_ms),
    ]
    token_counts = [num_patches if t == "all" else int(t) for t in args.tokens.split(",")]
    full = {num_patches if t == "all" else int(t) for t in args.full_tokens.split(",") if t}
    for k in token_counts:
        if k > num_patches:
            print(f"skipping K={k}: only {num_patches} patch tokens")
            continue
        tok_db = instance_tokens(raw_db, k).numpy().astype(np.float16)
        tok_q = instance_tokens(raw_q, k).numpy().astype(np.float16)
        for m in [int(m) for m in args.shortlists.split(",")] + ([n_db] if k in full else []):
            rerank = InstanceTokenRerank(top_m=m, tokens=k)
            ranked = shortlist[:, :m]
            runs = (args.repeats, True) if m < n_db else (1, False)
            ms = 1000 * median_seconds(lambda: rerank.rerank(tok_db, tok_q, ranked), runs[0], warmup=runs[1]) / len(q)
            label = f"K={k}{' (all)' if k == num_patches else ''}, " + ("full LI" if m == n_db else f"rerank M={m}")
            out = rerank.rerank(tok_db, tok_q, ranked)
            lines.append(_row(label, out[:, :widest] if m >= widest else np.concatenate(
                [out, shortlist[:, m:widest]], axis=1), positives, n_db, 2 * k * channels, ms, base_ms))
    print("\n".join(lines))
    print("bytes/img: what is stored per database image (the token rows hold only the tokens; a two-stage "
          "deployment keeps the descriptor or its codes too). ms/query on this machine, medians of "
          f"{args.repeats} runs; a busy machine makes them unreliable.")


if __name__ == "__main__":
    main()
