"""Reports of retrieval results: a printed table, JSON, Markdown, and pictures.

Pictures use matplotlib's object API on the Agg canvas (no pyplot, no display, no global state), so
they render on headless machines and in worker processes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from aggzoo.evaluation.retrieval import RetrievalResult

__all__ = ["format_table", "to_json", "write_json", "write_markdown"]


def _ks(results: Sequence[RetrievalResult]) -> list[int]:
    return sorted({k for r in results for k in r.recalls})


def _rows(results: Sequence[RetrievalResult]) -> tuple[list[str], list[list[str]]]:
    ks = _ks(results)
    header = ["benchmark", "queries", "database", *[f"R@{k}" for k in ks]]
    rows = []
    for r in results:
        recalls = [f"{100 * r.recalls[k]:.2f}" if k in r.recalls else "-" for k in ks]
        rows.append([r.name, str(r.num_queries), str(r.num_database), *recalls])
    return header, rows


def format_table(results: Sequence[RetrievalResult]) -> str:
    """A fixed-width table of Recall@k in percent, one row per benchmark."""
    header, rows = _rows(results)
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    rule = "-" * len(line(header))
    return "\n".join([line(header), rule, *map(line, rows)])


def to_json(results: Sequence[RetrievalResult], meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{"meta": ..., "results": [summary, ...]}``; recalls are fractions keyed by ``str(k)``."""
    return {"meta": dict(meta or {}), "results": [r.summary() for r in results]}


def write_json(results: Sequence[RetrievalResult], path: str | Path, meta: dict[str, Any] | None = None) -> Path:
    """Write :func:`to_json` to ``path`` (parents created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_json(results, meta), indent=2, default=_jsonable) + "\n")
    return path


def write_markdown(results: Sequence[RetrievalResult], path: str | Path, title: str = "Retrieval results") -> Path:
    """A Markdown table of Recall@k in percent (plus counts); returns the path."""
    header, rows = _rows(results)
    lines = [f"# {title}", "", "| " + " | ".join(header) + " |",
             "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    notes = [f"- {r.name}: {r.queries_without_positive} of {r.num_queries} queries have no positive (counted as misses)"
             for r in results if r.queries_without_positive]
    if notes:
        lines += ["", *notes]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
