"""Reports of retrieval results: a printed table, JSON, Markdown, and pictures.

Pictures use matplotlib's object API on the Agg canvas (no pyplot, no display, no global state), so
they render on headless machines and in worker processes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from aggzoo.evaluation.result import RetrievalResult
from aggzoo.hub.cfg import split_metric_key

__all__ = [
    "format_table", "to_json", "write_json", "write_markdown", "plot_recall_curves", "plot_retrievals", "pick_queries",
    "recall_curves_figure", "retrievals_figure", "figure_rgb", "grid_rows_caption",
    "plot_predictions", "published_figures", "published_setup_figures", "query_label", "record_published",
    "write_json_document",
]


def _ks(results: Sequence[RetrievalResult]) -> list[int]:
    return sorted({k for r in results for k in r.recalls})


def published_figures(metrics: Mapping[str, float], names: Sequence[str]) -> dict[int, float]:
    """The published Recall@k (percent) of a benchmark known by any of ``names``, from a
    :class:`~aggzoo.hub.cfg.PretrainedCfg`'s ``metrics`` (``"<benchmark>/R@<k>" -> percent``)."""
    out: dict[int, float] = {}
    for key, value in metrics.items():
        benchmark, setup, metric = split_metric_key(key)
        k = metric.removeprefix("R@")
        if benchmark in names and setup is None and metric.startswith("R@") and k.isdigit():
            out[int(k)] = float(value)
    return out


def published_setup_figures(metrics: Mapping[str, float], names: Sequence[str]) -> dict[str, float]:
    """The published per-setup figures (percent) of a benchmark known by any of ``names``, keyed as
    :attr:`RetrievalResult.metrics` keys them: ``"roxford5k/medium/mAP"`` -> ``{"medium/mAP": ...}``."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        benchmark, setup, metric = split_metric_key(key)
        if benchmark in names and setup is not None:
            out[f"{setup}/{metric}"] = float(value)
    return out


def record_published(result: RetrievalResult, published: Mapping[int, float],
                     setups: Mapping[str, float] | None = None) -> None:
    """Put the published figures (percent) and ours minus them (points) into ``result.extras``, so
    that ``results.json`` carries them and the tables show a ``published`` and a ``delta`` column: Recall@k
    (``published`` / ``delta``, by k; the table shows R@1) and the per-setup metrics (``published_metrics`` /
    ``delta_metrics``, by ``"<setup>/<metric>"``; the table shows mAP)."""
    if published:
        result.extras["published"] = {str(k): v for k, v in sorted(published.items())}
        result.extras["delta"] = {str(k): _points(100 * result.recalls[k] - v)
                                  for k, v in sorted(published.items()) if k in result.recalls}
    if setups:
        result.extras["published_metrics"] = dict(setups)
        result.extras["delta_metrics"] = {key: _points(100 * result.metrics[key] - v)
                                          for key, v in setups.items() if key in result.metrics}


def _points(value: float) -> float:
    return round(value, 2) + 0.0  # + 0.0: no "-0.0"


def _rows(results: Sequence[RetrievalResult]) -> tuple[list[str], list[list[str]]]:
    ks = _ks(results)
    # Recall@k in percent, said in the header (a newcomer reading 87.00 must not guess between 87 % and 0.87)
    header = ["benchmark", "queries", "database", *[f"R@{k} (%)" for k in ks]]
    # Beside ours, the R@1 the model's cfg publishes for that benchmark (where it has one).
    with_published = any("published" in r.extras for r in results)
    if with_published:
        header += ["published", "delta"]
    rows = []
    for r in results:
        recalls = [f"{100 * r.recalls[k]:.2f}" if k in r.recalls else "-" for k in ks]
        row = [r.name, str(r.num_queries), str(r.num_database), *recalls]
        if with_published:
            published, delta = r.extras.get("published", {}).get("1"), r.extras.get("delta", {}).get("1")
            row += [f"{published:.2f}" if published is not None else "-", f"{delta:+.2f}" if delta is not None else "-"]
        rows.append(row)
    return header, rows


def _metric_rows(results: Sequence[RetrievalResult]) -> tuple[list[str], list[list[str]]]:
    """One row per (benchmark, ground-truth setup) of the results with metrics besides Recall@k (mAP, mP@k; MAP@R,
    R-Precision), with the published mAP of that setup and ours minus it where the model's cfg publishes one."""
    scored = [r for r in results if r.metrics]
    names = sorted({key.split("/", 1)[1] for r in scored for key in r.metrics}, key=_metric_order)
    header = ["benchmark", "setup", "queries", "database", *[f"{n} (%)" for n in names]]
    with_published = any("published_metrics" in r.extras for r in scored)
    if with_published:
        header += ["published mAP", "delta"]
    rows = []
    for r in scored:
        setups = list(dict.fromkeys(key.split("/", 1)[0] for key in r.metrics))
        counts = r.extras.get("metric_queries", {})
        for setup in setups:
            values = [f"{100 * r.metrics[f'{setup}/{n}']:.2f}" if f"{setup}/{n}" in r.metrics else "-" for n in names]
            queries = counts.get(setup, {}).get("queries", r.num_queries)
            row = [r.name, setup, str(queries), str(r.num_database), *values]
            if with_published:
                published = r.extras.get("published_metrics", {}).get(f"{setup}/mAP")
                delta = r.extras.get("delta_metrics", {}).get(f"{setup}/mAP")
                row += [f"{published:.2f}" if published is not None else "-", f"{delta:+.2f}" if delta is not None else "-"]
            rows.append(row)
    return header, rows


def _metric_order(name: str) -> tuple[int, int, str]:
    """mAP, then mP@k by k (revisited Oxford / Paris); MAP@R, then R-Precision (metric learning); then any other."""
    if name.startswith("mP@") and name[3:].isdigit():
        return (1, int(name[3:]), "")
    return ({"mAP": 0, "MAP@R": 2, "R-Precision": 3}.get(name, 4), 0, name)


def _fixed_width(header: list[str], rows: list[list[str]], text_columns: int = 1) -> str:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i < text_columns else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    rule = "-" * len(line(header))
    return "\n".join([line(header), rule, *map(line, rows)])


def format_table(results: Sequence[RetrievalResult]) -> str:
    """Fixed-width tables in percent: Recall@k, one row per benchmark that reports it (place recognition, metric
    learning); and for benchmarks scored by other metrics, one row per benchmark and setup: mAP and mP@k (revisited
    Oxford/Paris, setups easy/medium/hard), MAP@R and R-Precision (metric learning, setup ``all``)."""
    tables = []
    recall = [r for r in results if r.reports_recall]
    if recall:
        tables.append(_fixed_width(*_rows(recall)))
    if any(r.metrics for r in results):
        tables.append(_fixed_width(*_metric_rows(results), text_columns=2))
    return "\n\n".join(tables)


def to_json(results: Sequence[RetrievalResult], meta: dict[str, Any] | None = None,
            labels: Sequence[str] | None = None) -> dict[str, Any]:
    """``{"meta": ..., "results": [summary, ...]}``; recalls are fractions keyed by ``str(k)``.

    ``labels`` (one per result) tell apart results of the same benchmark, e.g. the train job's
    ``pooling_baseline`` / ``untrained`` / ``trained`` rows (the keys of ``run_summary.json``)."""
    rows = [r.summary() for r in results]
    if labels is not None:
        if len(labels) != len(rows):
            raise ValueError(f"{len(labels)} labels for {len(rows)} results")
        rows = [{"label": label, **row} for label, row in zip(labels, rows)]
    return {"meta": dict(meta or {}), "results": rows}


def write_json(results: Sequence[RetrievalResult], path: str | Path, meta: dict[str, Any] | None = None,
               labels: Sequence[str] | None = None) -> Path:
    """Write :func:`to_json` to ``path`` (parents created); returns the path."""
    return _write_text(path, json.dumps(to_json(results, meta, labels), indent=2, default=_jsonable) + "\n")


def write_json_document(document: dict[str, Any], path: str | Path) -> Path:
    """Write a :func:`to_json` document (perhaps with rows of an earlier run added) to ``path``."""
    return _write_text(path, json.dumps(document, indent=2, default=_jsonable) + "\n")


def write_markdown(results: Sequence[RetrievalResult], path: str | Path, title: str = "Retrieval results") -> Path:
    """Markdown tables of Recall@k (and of mAP / mP@k, MAP@R / R-Precision where the benchmark reports them) in
    percent, with counts; returns the path."""
    lines = [f"# {title}"]
    tables = []
    recall = [r for r in results if r.reports_recall]
    if recall:
        tables.append((_rows(recall), 1))
    if any(r.metrics for r in results):
        tables.append((_metric_rows(results), 2))
    for (header, rows), text_columns in tables:
        lines += ["", "| " + " | ".join(header) + " |",
                  "|" + "|".join(["---"] * text_columns + ["---:"] * (len(header) - text_columns)) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
    notes = [f"- {r.name}: {r.queries_without_positive} of {r.num_queries} queries have no positive (counted as misses)"
             for r in results if r.queries_without_positive]
    if notes:
        lines += ["", *notes]
    return _write_text(path, "\n".join(lines) + "\n")


def _write_text(path: str | Path, text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


# -- pictures --------------------------------------------------------------------------------------


def _figure(width_in: float, height_in: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width_in, height_in), dpi=100)
    FigureCanvasAgg(figure)
    return figure


def _save_figure(figure: Any, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    return path


def figure_rgb(figure: Any) -> np.ndarray:
    """A figure from this module drawn on its Agg canvas: ``uint8 [H, W, 3]`` (what image loggers take)."""
    figure.canvas.draw()
    return np.asarray(figure.canvas.buffer_rgba())[..., :3].copy()


def plot_recall_curves(results: Sequence[RetrievalResult], path: str | Path, title: str = "Recall@k") -> Path:
    """Recall@k for every k (1..K) per benchmark on one PNG, with the reported cut-offs marked."""
    return _save_figure(recall_curves_figure(results, title), path)


def recall_curves_figure(results: Sequence[RetrievalResult], title: str = "Recall@k") -> Any:
    """The matplotlib ``Figure`` of :func:`plot_recall_curves` (640 x 440 px), laid out, not saved."""
    figure = _figure(6.4, 4.4)
    axes = figure.add_subplot(1, 1, 1)
    for r in results:
        ks = np.arange(1, len(r.curve) + 1)
        label = f"{r.name} (R@1 {100 * r.recalls.get(1, r.curve[0]):.1f})"
        (line,) = axes.plot(ks, 100 * np.asarray(r.curve), label=label)
        marked = [k for k in r.recalls if k <= len(r.curve)]
        axes.scatter(marked, [100 * r.curve[k - 1] for k in marked], color=line.get_color(), s=18, zorder=3)
    axes.set_xscale("log")
    axes.set_xlabel("k (number of retrieved database images)")
    axes.set_ylabel("Recall@k (%)")
    top = max(float(np.max(r.curve)) for r in results) if results else 1.0
    axes.set_ylim(0, min(100.0, 10.0 * np.ceil(10.0 * top + 0.5)))  # room above the highest curve
    axes.grid(True, which="both", alpha=0.3)
    axes.set_title(title)
    axes.legend(loc="best", fontsize=8)
    figure.tight_layout()
    return figure


def _thumbnail(path: Path, height: int) -> np.ndarray:
    from PIL import Image

    from aggzoo.data.images import read_rgb

    image = Image.fromarray(read_rgb(path))
    width = max(1, round(image.width * height / image.height))
    return np.asarray(image.resize((width, height), Image.Resampling.BICUBIC))


def pick_queries(result: RetrievalResult, num_queries: int, seed: int = 0) -> list[int]:
    """A reproducible mix of queries: about half answered correctly at rank 1, half not."""
    rs = result.retrieval_set
    if rs is None:
        raise ValueError("the result holds no retrieval_set (paths and positives) to draw")
    top1 = result.predictions[:, 0]
    correct = np.array([top1[q] in rs.positives[q] for q in range(rs.num_queries)])
    rng = np.random.default_rng(seed)
    good, bad = np.flatnonzero(correct), np.flatnonzero(~correct)
    n_bad = min(len(bad), num_queries // 2 if len(good) else num_queries)
    n_good = min(len(good), num_queries - n_bad)
    n_bad = min(len(bad), num_queries - n_good)
    chosen = np.concatenate([rng.choice(good, n_good, replace=False), rng.choice(bad, n_bad, replace=False)])
    return sorted(int(q) for q in chosen)


def grid_rows_caption(result: RetrievalResult, rows: Sequence[int], *, picked: bool) -> str:
    """How the rows of a retrieval grid were chosen, for its title: :func:`pick_queries` draws failures on
    purpose, so the grid is no sample of the model's accuracy and must say so (with the true R@1)."""
    rs = result.retrieval_set
    assert rs is not None
    right = sum(1 for q in rows if result.predictions[q, 0] in rs.positives[q])
    counts = f"{right} right at rank 1, {len(rows) - right} wrong"
    if not picked:
        return f"rows: the {len(rows)} queries asked for ({counts})"
    top1 = np.array([result.predictions[q, 0] in rs.positives[q] for q in range(rs.num_queries)])
    return (f"rows chosen to show failures, not a random sample: {counts} "
            f"(R@1 over all {rs.num_queries} queries: {100 * top1.mean():.2f} %)")


def plot_retrievals(
    result: RetrievalResult,
    path: str | Path,
    *,
    queries: Sequence[int] | None = None,
    num_queries: int = 6,
    k: int = 5,
    thumb_height: int = 120,
    seed: int = 0,
) -> Path:
    """:func:`retrievals_figure` saved as a PNG at ``path``."""
    return _save_figure(retrievals_figure(result, queries=queries, num_queries=num_queries, k=k,
                                          thumb_height=thumb_height, seed=seed), path)


def retrievals_figure(
    result: RetrievalResult,
    *,
    queries: Sequence[int] | None = None,
    num_queries: int = 6,
    k: int = 5,
    thumb_height: int = 120,
    seed: int = 0,
) -> Any:
    """A matplotlib ``Figure``, laid out, not saved: a grid of one row per query (left, blue frame)
    with its top-``k`` database images, each framed green when it is a positive and red when not,
    titled with its rank; the last column shows the query's first positive (dashed frame) and the
    rank at which it was retrieved.

    ``queries`` picks the rows; by default :func:`pick_queries` mixes successes and failures at rank 1,
    and the title says so (:func:`grid_rows_caption`).
    """
    rs = result.retrieval_set
    if rs is None:
        raise ValueError("the result holds no retrieval_set (paths and positives) to draw")
    rows = list(queries) if queries is not None else pick_queries(result, num_queries, seed)
    k = min(k, result.predictions.shape[1])
    grid_rows = []
    for q in rows:
        positives = rs.positives[q]
        junk = rs.junk[q] if rs.junk is not None else ()
        cells: list[_Cell] = [(rs.query_paths[q], f"query {q}", "tab:blue", "solid")]
        for rank, db in enumerate(result.predictions[q, :k], start=1):
            if db < 0:
                cells.append((None, f"#{rank}: none", "grey", "solid"))
                continue
            hit = db in positives
            if not hit and db in junk:  # neither right nor wrong: the protocol ignores it
                cells.append((rs.database_paths[db], f"#{rank} junk (ignored)", "tab:orange", "dotted"))
                continue
            cells.append((rs.database_paths[db], f"#{rank} {'correct' if hit else 'wrong'}",
                          "tab:green" if hit else "tab:red", "solid"))
        if len(positives):
            ranks = np.flatnonzero(np.isin(result.predictions[q], positives))
            where = f"rank {ranks[0] + 1}" if ranks.size else f"not in top {result.predictions.shape[1]}"
            cells.append((rs.database_paths[positives[0]], f"positive ({where})", "tab:green", "dashed"))
        else:
            cells.append((None, "no positive", "grey", "dashed"))
        grid_rows.append(cells)
    junk_note = ", orange = junk" if rs.junk is not None else ""
    title = (f"{result.name}: query (blue), top-{k} retrievals (green = positive, red = not{junk_note}), "
             "first positive (dashed)\n"
             f"{grid_rows_caption(result, rows, picked=queries is None)}")
    return _grid_figure(grid_rows, title, thumb_height)


#: one picture of a grid: (image file or None, caption, frame colour, frame line style)
_Cell = tuple[Path | None, str, str, str]


def _grid_figure(rows: Sequence[Sequence[_Cell]], title: str, thumb_height: int) -> Any:
    """Thumbnails in rows, each framed and captioned; the grid's width is its longest row. A laid-out
    ``Figure``, not saved."""
    width = max((len(r) for r in rows), default=1)
    first_path = rows[0][0][0] if rows else None
    first = _thumbnail(first_path, thumb_height) if first_path is not None else np.zeros((1, 1, 3), np.uint8)
    cell_w = 2.0
    cell_h = cell_w * first.shape[0] / first.shape[1] + 0.35
    figure = _figure(cell_w * width, cell_h * max(len(rows), 1) + 0.5)
    grid = figure.subplots(max(len(rows), 1), width, squeeze=False)
    for r, cells in enumerate(rows):
        for c in range(width):
            axes = grid[r][c]
            axes.set_xticks([])
            axes.set_yticks([])
            if c >= len(cells):
                axes.set_axis_off()
                continue
            image_path, label, colour, style = cells[c]
            if image_path is not None:
                axes.imshow(first if (r, c) == (0, 0) else _thumbnail(image_path, thumb_height))
            for spine in axes.spines.values():
                spine.set_edgecolor(colour)
                spine.set_linewidth(4)
                spine.set_linestyle(style)
            axes.set_title(label, fontsize=8, color=colour)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    return figure


def query_label(path: str | Path, width: int = 28) -> str:
    """A query's file name as a picture's label, shortened in the middle to ``width`` characters."""
    name = Path(path).name
    if len(name) <= width:
        return name
    keep = (width - 3) // 2
    return f"{name[:keep]}...{name[-(width - 3 - keep):]}"


def plot_predictions(
    query_paths: Sequence[Path],
    database_paths: Sequence[Path],
    predictions: np.ndarray,
    path: str | Path,
    *,
    captions: Sequence[Sequence[str]] | None = None,
    queries: Sequence[int] | None = None,
    grid: tuple[int, int] = (6, 5),
    title: str = "predictions",
) -> Path:
    """The retrieval grid without ground truth: one row per query (blue frame) with its top-``k``
    database images (grey frames: nothing says which are right), ``captions[q][rank]`` under each
    (score, distance). ``grid``: ``(num_queries, k)``; ``queries`` picks the rows, by default ``num_queries``
    spread evenly over the queries.

    Args:
        predictions: ``[Q, K]`` database indices, best first (``-1``: none).
    """
    predictions = np.asarray(predictions)
    num_queries, k = grid
    if queries is None:
        queries = sorted({int(q) for q in np.linspace(0, len(query_paths) - 1, min(num_queries, len(query_paths)))})
    k = min(k, predictions.shape[1])
    grid_rows = []
    for q in queries:
        cells: list[_Cell] = [(Path(query_paths[q]), query_label(query_paths[q]), "tab:blue", "solid")]
        for rank, db in enumerate(predictions[q, :k]):
            caption = captions[q][rank] if captions is not None else ""
            cells.append((Path(database_paths[db]) if db >= 0 else None,
                          f"#{rank + 1} {caption}".strip() if db >= 0 else f"#{rank + 1}: none", "tab:gray", "solid"))
        grid_rows.append(cells)
    return _save_figure(_grid_figure(grid_rows, f"{title}: query (blue), its top-{k} database images (no ground truth)",
                                     120), path)

