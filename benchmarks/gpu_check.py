"""The GPU checks of issue 12 (item 8), prepared to run whenever a machine with a GPU is at hand.

    python benchmarks/gpu_check.py                      # all three, a few minutes on one GPU
    python benchmarks/gpu_check.py --only faiss,extraction --images 512 --repeats 5

(a) ``faiss``: the FAISS GPU index against the CPU one, through :func:`aggzoo.evaluation.index.build_index`
    (``use_gpu=True`` / ``False``), for ``Flat`` and ``IVF<nlist>,Flat`` (the GPU IVF is copied from the same
    trained CPU index, so both scan the same lists): the fraction of queries whose top-k ids are the same, and
    the largest score difference. A row that differs is explained only by near-ties (scores within 1e-4).
(b) ``extraction``: images/s of :func:`extract_descriptors` (decode + resize in workers, pinned memory,
    overlapped host-to-device copies) against the bare forward on the very same batches already on the GPU
    (same dtype, memory format, inference mode and batch size: a true lower bound), in fp32 and under bf16
    autocast; plus the cosine between fp32 and bf16 descriptors.
(c) ``ddp``: ``python eval.py trainer=ddp trainer.devices=1`` against the single-process ``python eval.py``
    on the synthetic benchmark: the same Recall@k and the same predictions. Runs only where eval.py takes a
    ``trainer`` group (issue 12 item 7); otherwise it says so.

Without a GPU (or with a CPU-only FAISS for (a)) each check prints why it is skipped and the script exits 0,
so it can run anywhere. Exit status 1 when a check that ran failed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import interleaved_seconds, round_ratios, write_random_jpegs

ROOT = Path(__file__).resolve().parents[1]

CHECKS = ("faiss", "extraction", "ddp")


def _gpu_reason() -> str | None:
    """Why the torch GPU checks cannot run here, or None."""
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device visible to torch"
    return None


# ------------------------------------------------------------------------------------------ (a) FAISS


def check_faiss(n: int, d: int, n_queries: int, k: int, nlist: int, nprobe: int) -> tuple[bool | None, str]:
    from aggzoo.evaluation.index import build_index, faiss_available
    from aggzoo.evaluation.options import SearchOptions

    if not faiss_available():
        return None, "skipped: faiss is not installed"
    import faiss

    if not hasattr(faiss, "StandardGpuResources") or faiss.get_num_gpus() == 0:
        return None, ("skipped: this faiss build has no GPU support (pip install faiss-gpu-cu12)" if
                      not hasattr(faiss, "StandardGpuResources") else "skipped: faiss sees no GPU")
    rng = np.random.default_rng(0)
    db = rng.standard_normal((n, d), dtype=np.float32)
    db /= np.linalg.norm(db, axis=1, keepdims=True)
    q = db[rng.choice(n, n_queries, replace=False)] + 0.1 * rng.standard_normal((n_queries, d), dtype=np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    lines, ok = [], True
    for spec, params in (("Flat", None), (f"IVF{nlist},Flat", f"nprobe={nprobe}")):
        cpu = build_index(db, SearchOptions(index=spec, search_params=params, use_gpu=False))
        if spec == "Flat":  # aggzoo's own GPU path (it keeps the GpuResources alive with the index)
            gpu_index = build_index(db, SearchOptions(index=spec, use_gpu=True))
        else:  # the same trained lists on both: the CPU index copied to the GPU
            res = faiss.StandardGpuResources()
            gpu_index = faiss.index_cpu_to_gpu(res, 0, cpu)
            faiss.GpuParameterSpace().set_index_parameters(gpu_index, params)
        on_gpu = "Gpu" in type(faiss.downcast_index(gpu_index)).__name__ or "Gpu" in type(gpu_index).__name__
        s_cpu, i_cpu = cpu.search(q, k)
        start = time.perf_counter()
        s_gpu, i_gpu = gpu_index.search(q, k)
        gpu_ms = 1000 * (time.perf_counter() - start) / n_queries
        same = (i_cpu == i_gpu).all(axis=1)
        diff = float(np.abs(s_cpu - s_gpu).max())
        # A differing row must be a near-tie swap: the k-th scores agree to 1e-4.
        explained = np.abs(np.sort(s_cpu[~same], axis=1) - np.sort(s_gpu[~same], axis=1)).max(initial=0.0) < 1e-4
        row_ok = on_gpu and diff < 1e-4 and bool(explained) and same.mean() >= 0.99
        ok &= row_ok
        lines.append(f"  {spec:<14} on GPU: {on_gpu!s:<5} top-{k} identical {100 * same.mean():6.2f}% of {n_queries} "
                     f"queries, max |score diff| {diff:.1e}, GPU {gpu_ms:.3f} ms/query  {'ok' if row_ok else 'FAIL'}")
    return ok, "\n".join(lines)


# ------------------------------------------------------------------------------------- (b) extraction


def check_extraction(backbone: str, image_size: int, num_images: int, batch_size: int, workers: int,
                     repeats: int) -> tuple[bool | None, str]:
    if reason := _gpu_reason():
        return None, f"skipped: {reason}"
    import torch
    from torch.utils.data import DataLoader

    from aggzoo.data.retrieval_set import ImageListDataset
    from aggzoo.data.transforms import eval_transform
    from aggzoo.evaluation.extraction import extract_descriptors
    from aggzoo.evaluation.options import ExtractionOptions
    from aggzoo.models.backbones.timm_backbone import TimmBackbone
    from aggzoo.models.heads.gem import GeM
    from aggzoo.models.modes import evaluating
    from aggzoo.models.vpr_model import VPRModel

    device = torch.device("cuda")
    # Random weights: throughput does not depend on them, and nothing is downloaded.
    model = VPRModel(TimmBackbone(backbone, pretrained=False), GeM).eval().to(device)
    transform = eval_transform((image_size, image_size))
    lines = [f"  {backbone} + GeM at {image_size}x{image_size}, batch {batch_size}, {num_images} JPEGs 480x640, "
             f"{workers} workers, {torch.cuda.get_device_name(0)}; {repeats} interleaved rounds, medians"]
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_random_jpegs(tmp, num_images)
        batches = [images.to(device) for images, _ in DataLoader(ImageListDataset(paths, transform),
                                                                  batch_size=batch_size)]
        descriptors = {}
        for name, dtype in (("fp32", None), ("bf16", torch.bfloat16)):
            def forward_only() -> None:
                with evaluating(model), torch.inference_mode():
                    for images in batches:
                        with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
                            model(images).float().cpu().numpy()
                torch.cuda.synchronize()

            def pipeline() -> np.ndarray:
                return extract_descriptors(model, paths, transform, ExtractionOptions(
                    batch_size=batch_size, num_workers=workers, device=str(device), precision=name, progress=False))

            times = interleaved_seconds({"forward": forward_only, "pipeline": pipeline}, repeats)
            forward = num_images / statistics.median(times["forward"])
            full = num_images / statistics.median(times["pipeline"])
            ratio = statistics.median(round_ratios(times, "forward", "pipeline"))
            descriptors[name] = pipeline()
            lines.append(f"  {name}: forward only {forward:8.1f} images/s, extract_descriptors {full:8.1f} images/s "
                         f"({ratio:.2f}x of the forward, median of the rounds' ratios)")
    a, b = descriptors["fp32"], descriptors["bf16"]
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    lines.append(f"  fp32 vs bf16 descriptors: cosine min {cos.min():.5f}, mean {cos.mean():.5f}")
    return True, "\n".join(lines)


# ---------------------------------------------------------------------------------------------- (c) DDP


def _eval_takes_trainer() -> bool:
    from hydra import compose, initialize_config_dir
    from hydra.errors import ConfigCompositionException, MissingConfigException

    try:
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
            compose("eval", overrides=["trainer=ddp", "trainer.devices=1"])
    except (ConfigCompositionException, MissingConfigException):  # no 'trainer' group in eval.yaml
        return False
    return True


def _run_eval(out: Path, overrides: Sequence[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, str(ROOT / "eval.py"), f"paths.log_dir={out}", f"hydra.run.dir={out}",
           "evaluation.save_predictions=true", "evaluation.pictures=false", *overrides]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    found = sorted(out.rglob("results.json"))
    if not found:
        raise RuntimeError(f"{' '.join(cmd)} wrote no results.json under {out}")
    results = json.loads(found[-1].read_text())
    predictions = {p.name: np.load(p) for p in found[-1].parent.glob("predictions_*.npy")}
    return {"results": results, "predictions": predictions}


def check_ddp() -> tuple[bool | None, str]:
    if reason := _gpu_reason():
        return None, f"skipped: {reason}"
    if not _eval_takes_trainer():
        return None, "skipped: eval.py takes no trainer group in this build (distributed evaluation, issue 12 item 7)"
    with tempfile.TemporaryDirectory() as tmp:
        single = _run_eval(Path(tmp) / "single", [])
        ddp = _run_eval(Path(tmp) / "ddp", ["trainer=ddp", "trainer.devices=1"])

    def recalls(run: dict) -> list:
        rows = run["results"]["results"] if "results" in run["results"] else run["results"]
        return [(r["name"], r["recalls"]) for r in rows]

    same_recalls = recalls(single) == recalls(ddp)
    same_predictions = (single["predictions"].keys() == ddp["predictions"].keys() and all(
        np.array_equal(single["predictions"][k], ddp["predictions"][k]) for k in single["predictions"]))
    ok = same_recalls and same_predictions and bool(single["predictions"])
    return ok, (f"  single process: {recalls(single)}\n  ddp, 1 GPU:     {recalls(ddp)}\n"
                f"  same recalls: {same_recalls}, same predictions: {same_predictions}  {'ok' if ok else 'FAIL'}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(CHECKS), help=f"checks to run, from {','.join(CHECKS)}")
    parser.add_argument("--n", type=int, default=200_000, help="(a) database size")
    parser.add_argument("--dim", type=int, default=512, help="(a) descriptor dimension")
    parser.add_argument("--queries", type=int, default=2000, help="(a) queries")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--nlist", type=int, default=1024)
    parser.add_argument("--nprobe", type=int, default=32)
    parser.add_argument("--backbone", default="tf_efficientnet_lite0")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=min(8, max(1, (os.cpu_count() or 2) - 1)))
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    selected = [c for c in args.only.split(",") if c]
    if unknown := sorted(set(selected) - set(CHECKS)):
        parser.error(f"--only: unknown checks {unknown}; choose from {','.join(CHECKS)}")
    runs = {
        "faiss": lambda: check_faiss(args.n, args.dim, args.queries, args.k, args.nlist, args.nprobe),
        "extraction": lambda: check_extraction(args.backbone, args.image_size, args.images, args.batch_size,
                                               args.workers, args.repeats),
        "ddp": check_ddp,
    }
    failed = False
    for name in selected:
        ok, report = runs[name]()
        print(f"({'abc'[CHECKS.index(name)]}) {name}: {'skipped' if ok is None else 'ok' if ok else 'FAILED'}")
        print(report if report.startswith("  ") else f"  {report}", flush=True)
        failed |= ok is False
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
