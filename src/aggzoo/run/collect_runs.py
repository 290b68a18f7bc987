"""Collect runs (a sweep's folder, or any folder of runs) into one comparison table.

    python train.py -m head=gem,netvlad,convap trainer.max_epochs=3
    python -m aggzoo.run.collect_runs logs/train/multiruns/<date>   [--format md|csv|json] [--sort R@1]

Every run folder holding a ``run_summary.json`` (written by :func:`aggzoo.run.pipeline.train`) becomes one
row: what the sweep changed (its Hydra overrides), head, descriptor size, parameters, seconds and
images per training step, and Recall@k (in percent, headed ``R@k (%)``) of the trained model on each
test benchmark, with the R@1 of the same model untrained and of global average pooling over the
untrained backbone. An ``eval.py``
run (its ``results.json``) gives its overrides and Recall@k. Folders of runs that failed or are still
running are listed with no metrics; columns no run fills are left out.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["collect_runs", "common_overrides", "format_runs", "main"]

SUMMARY_FILE = "run_summary.json"
#: what ``eval.py`` writes (``aggzoo.run.pipeline.evaluate``): its runs are listed with their Recall@k
EVAL_RESULTS_FILE = "results.json"
#: written by :func:`aggzoo.run.sweep.keep_sweeping` when a sweep job fails: reason, blank line, traceback
ERROR_FILE = "run_error.txt"


def common_overrides(runs: list[dict[str, Any]]) -> set[str]:
    """The overrides every run of ``runs`` shares (none for a lone run)."""
    # What every run shares is the sweep's fixed part; a lone run shows all its overrides.
    sets = [set(r.get("overrides", [])) for r in runs if r.get("overrides") is not None]
    return set.intersection(*sets) if len(sets) > 1 else set()


def _overrides(folder: Path) -> list[str]:
    """The command-line overrides Hydra recorded for the run in ``folder``."""
    path = folder / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return []
    return [line[2:].strip() for line in path.read_text().splitlines() if line.startswith("- ")]


def _natural_order(folder: Path) -> list[Any]:
    # Hydra numbers sweep jobs 0, 1, ..., 10: job 10 sorts after job 9, not after job 1.
    return [[int(t) if t.isdigit() else t for t in re.split(r"(\d+)", part)] for part in folder.parts]


def collect_runs(root: str | Path) -> list[dict[str, Any]]:
    """One dict per run folder under ``root`` (``root`` itself included), sorted by folder.

    A run folder holds a ``run_summary.json`` or a Hydra ``.hydra/config.yaml``. One without a summary
    or eval results (failed, killed or still running) gets its overrides and a status only.
    """
    root = Path(root)
    if not root.exists():
        raise FileNotFoundError(f"{root}: no such folder (pass a sweep folder like logs/train/multiruns/<date>)")
    runs: list[dict[str, Any]] = []
    folders = set()
    for path in root.rglob("*"):  # one walk: run folders sit beside checkpoints and logs
        if path.name == SUMMARY_FILE:
            folders.add(path.parent)
        elif path.name == "config.yaml" and path.parent.name == ".hydra" and path.parent != root:
            folders.add(path.parent.parent)
    for folder in sorted(folders, key=_natural_order):
        entry: dict[str, Any] = {"run": str(folder.relative_to(root)) if folder != root else "."}
        summary_path = folder / SUMMARY_FILE
        if summary_path.is_file():
            entry.update(json.loads(summary_path.read_text()))
            # Written at train start too (baseline rows): its status says whether the run ended.
            entry["status"] = entry.get("status") or "done"
        elif (folder / EVAL_RESULTS_FILE).is_file():  # an eval.py run: its Recall@k per benchmark
            results = json.loads((folder / EVAL_RESULTS_FILE).read_text())["results"]
            entry["overrides"] = _overrides(folder)
            entry["test"] = {"trained": {r["name"]: r["recalls"] for r in results}}
            # the benchmark's other metrics (revisited Oxford/Paris: "<setup>/mAP", "<setup>/mP@k"; metric learning:
            # "all/MAP@R", "all/R-Precision")
            entry["metrics"] = {r["name"]: r["metrics"] for r in results if r.get("metrics")}
            entry["status"] = "done"
        else:
            entry["overrides"] = _overrides(folder)
            error = folder / ERROR_FILE
            entry["status"] = (f"failed: {error.read_text().splitlines()[0][:300]}" if error.is_file()
                               else "no summary (failed, killed or running)")
        runs.append(entry)
    if not runs:
        raise FileNotFoundError(f"no runs under {root} (looked for {SUMMARY_FILE} and .hydra/config.yaml)")
    return runs


def _rows(runs: list[dict[str, Any]], ks: Sequence[int]) -> tuple[list[str], list[list[Any]]]:
    common = common_overrides(runs)
    benchmarks = sorted({name for r in runs for name in (r.get("test", {}).get("trained", {}) or {})})
    # mAP per setup of the benchmarks scored by it, MAP@R of the metric-learning ones (mP@k and R-Precision stay in
    # each run's results.md: too many columns here)
    maps = {name: sorted({m for r in runs for m in (r.get("metrics", {}).get(name) or {})
                          if m.endswith(("/mAP", "/MAP@R"))},
                         key=lambda m: ("easy", "medium", "hard").index(m.split("/")[0])
                         if m.split("/")[0] in ("easy", "medium", "hard") else 3)
            for name in benchmarks}
    header = ["run", "changes", "head", "D", "params (M)", "trainable (M)", "s/step", "img/s"]
    for name in benchmarks:
        header += [f"{name} R@{k} {PERCENT}" for k in ks]
        header += [f"{name} {metric} {PERCENT}" for metric in maps[name]]
        header += [f"{name} untrained R@1 {PERCENT}", f"{name} avg-pool baseline R@1 {PERCENT}"]
    header.append("status")
    rows = []
    for r in runs:
        changes = " ".join(o for o in r.get("overrides", []) if o not in common) or "-"
        row: list[Any] = [r["run"], changes, r.get("head"), r.get("descriptor_dim"),
                          _millions(r.get("params")), _millions(r.get("trainable_params")),
                          _round(r.get("seconds_per_step"), 3), _round(r.get("images_per_second"), 1)]
        test = r.get("test", {}) or {}
        trained, baseline, pooling = (test.get(key, {}) or {} for key in ("trained", "untrained", "pooling_baseline"))
        for name in benchmarks:
            recalls = trained.get(name, {})
            row += [_percent(recalls.get(str(k))) for k in ks]
            row += [_percent((r.get("metrics", {}).get(name) or {}).get(metric)) for metric in maps[name]]
            row += [_percent(baseline.get(name, {}).get("1")), _percent(pooling.get(name, {}).get("1"))]
        row.append(r.get("status"))
        rows.append(row)
    return header, rows


def _millions(value: Any) -> Any:
    return None if value is None else round(value / 1e6, 3)


def _round(value: Any, digits: int) -> Any:
    return None if value is None else round(float(value), digits)


def _percent(value: Any) -> Any:
    return None if value is None else round(100.0 * float(value), 2)


_ALWAYS = ("run", "changes", "status")
#: the unit of the Recall@k columns, as the evaluation report labels them (``R@1 (%)``)
PERCENT = "(%)"


def _column(header: list[str], sort: str) -> int | None:
    """The first column named ``sort``, or ending in `` <sort>``; the ``(%)`` unit may be left out
    (``R@1`` is the first benchmark's ``<benchmark> R@1 (%)``)."""
    for i, name in enumerate(header):
        for candidate in (name, name.removesuffix(f" {PERCENT}")):
            if candidate == sort or candidate.endswith(" " + sort):
                return i
    return None


def format_runs(runs: list[dict[str, Any]], *, fmt: str = "md", ks: Sequence[int] = (1, 5, 10),
                sort: str | None = None) -> str:
    """The comparison table as Markdown (``md``), ``csv`` or ``json``. ``sort``: a column name
    (``"R@1"`` sorts by the first benchmark's R@1), largest first. Recall@k columns are in percent,
    labelled ``R@k (%)``."""
    header, rows = _rows(runs, ks)
    # A column no run fills (the baselines of eval.py runs, a benchmark's R@20 nobody computed) is left out.
    keep = [i for i, name in enumerate(header) if name in _ALWAYS or any(row[i] is not None for row in rows)]
    header, rows = [header[i] for i in keep], [[row[i] for i in keep] for row in rows]
    if sort:
        column = _column(header, sort)
        if column is None:
            raise ValueError(f"--sort {sort!r}: no such column; columns are {header}")
        rows.sort(key=lambda row: (row[column] is None, -(row[column] or 0) if isinstance(row[column], (int, float))
                                   else str(row[column])))
    if fmt == "json":
        return json.dumps([dict(zip(header, row)) for row in rows], indent=2)
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(header)
        writer.writerows(rows)
        return out.getvalue()
    if fmt != "md":
        raise ValueError(f"format must be md, csv or json, got {fmt!r}")
    cells = [[("" if v is None else str(v).replace("|", "\\|")) for v in row] for row in rows]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m aggzoo.run.collect_runs <folder>``: print the comparison table of its runs; the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", type=Path, help="a sweep folder (logs/train/multiruns/<date>) or any folder of runs")
    parser.add_argument("--format", choices=("md", "csv", "json"), default="md")
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 5, 10], help="Recall@k columns")
    parser.add_argument("--sort", default=None, help='sort by a column, largest first (e.g. "R@1", "img/s")')
    args = parser.parse_args(argv)
    try:
        runs = collect_runs(args.root)
        print(format_runs(runs, fmt=args.format, ks=args.ks, sort=args.sort))
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
