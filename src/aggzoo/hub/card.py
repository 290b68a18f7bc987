"""The README.md model card of a saved model folder (a Hugging Face model repository).

A card is Markdown with YAML front matter (``license``, ``tags``, ``library_name``,
``pipeline_tag``: what the Hub indexes and filters on), written with huggingface_hub's
:class:`~huggingface_hub.ModelCard` / :class:`~huggingface_hub.ModelCardData`. The body says how to
load the model, what it is (head, backbone, descriptor size, preprocessing), the recipe that made it,
its licence, paper and code, and the metrics: the ones recorded on its :class:`PretrainedCfg` and the
table of the run that produced it (a training run's ``run_summary.json``, or the ``test_results.json``
/ ``results.json`` of ``train.py`` / ``eval.py``).

Only data goes into a card; nothing in it is ever read back to build a model (``config.json`` and
the safetensors metadata are what the one builder reads).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from huggingface_hub import ModelCard, ModelCardData

from aggzoo.errors import ConfigError
from aggzoo.hub.cfg import PretrainedCfg

__all__ = ["CARD_FILE", "hf_license", "model_card", "read_results_file"]

CARD_FILE = "README.md"
#: Licence identifiers the Hub knows, as our registry writes them (first word of ``PretrainedCfg.license``).
_HF_LICENSES = {"apache-2.0", "mit", "gpl-3.0", "gpl-2.0", "lgpl-3.0", "agpl-3.0", "bsd-2-clause", "bsd-3-clause",
                "cc-by-4.0", "cc-by-sa-4.0", "cc-by-nc-4.0", "cc-by-nc-sa-4.0", "cc0-1.0", "unlicense", "openrail"}
_TAGS = ["aggzoo", "visual-place-recognition", "image-retrieval", "image-feature-extraction"]


def hf_license(text: str | None) -> dict[str, str]:
    """Front-matter licence fields: ``{"license": "mit"}`` for ``"MIT (gmberton/CosPlace)"``; a licence the
    Hub has no identifier for (or none stated) is ``license: other`` with a ``license_name``."""
    first = (text or "").strip().split(" ", 1)[0].lower()
    if first in _HF_LICENSES:
        return {"license": first}
    slug = re.sub(r"[^a-z0-9]+", "-", (text or "unspecified").lower()).strip("-")[:60] or "unspecified"
    return {"license": "other", "license_name": slug}


def read_results_file(path: str | os.PathLike) -> dict[str, Any]:
    """A run's ``run_summary.json`` / ``test_results.json`` / ``results.json`` as a dict."""
    path = Path(path).expanduser()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"results file not found: {path} (pass a run folder's run_summary.json or "
                          "test_results.json, or eval.py's results.json)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path} is not valid JSON ({error}); pass the file train.py / eval.py wrote") from None
    if not isinstance(data, dict) or not ("results" in data or "test" in data):
        raise ConfigError(f"{path} holds neither 'results' (test_results.json / results.json) nor 'test' "
                          "(run_summary.json): not a results file of train.py / eval.py")
    return data


def _result_rows(run_summary: Mapping[str, Any] | None, test_results: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """``[{"label", "benchmark", "recalls": {k: fraction}, "queries", "database"}]`` of the run."""
    if test_results is not None:
        return [{"label": row.get("label", ""), "benchmark": row.get("name", "?"),
                 "recalls": {int(k): float(v) for k, v in row.get("recalls", {}).items()},
                 "queries": row.get("num_queries"), "database": row.get("num_database")}
                for row in test_results.get("results", [])]
    if run_summary is not None:
        return [{"label": label, "benchmark": bench, "recalls": {int(k): float(v) for k, v in recalls.items()},
                 "queries": None, "database": None}
                for label, benches in run_summary.get("test", {}).items() for bench, recalls in benches.items()]
    return []


def _results_table(rows: list[dict[str, Any]]) -> list[str]:
    ks = sorted({k for row in rows for k in row["recalls"]})
    lines = ["| row | benchmark | " + " | ".join(f"R@{k}" for k in ks) + " | queries | database |",
             "|---|---|" + "---:|" * (len(ks) + 2)]
    for row in rows:
        cells = [f"{100 * row['recalls'][k]:.1f}" if k in row["recalls"] else "-" for k in ks]
        counts = [str(row[c]) if row[c] is not None else "-" for c in ("queries", "database")]
        lines.append(f"| {row['label'] or '-'} | {row['benchmark']} | " + " | ".join(cells + counts) + " |")
    return lines


def model_card(
    *,
    spec: Mapping[str, Any],
    architecture: str | None,
    out_dim: int | None,
    cfg: PretrainedCfg | None,
    repo_id: str | None = None,
    license: str | None = None,
    run_summary: Mapping[str, Any] | None = None,
    test_results: Mapping[str, Any] | None = None,
) -> ModelCard:
    """The card of a model built from ``spec`` (``{"backbone": {...}, "head": {...}}``).

    Args:
        architecture: the registered ``<head>_<backbone>`` name, when there is one.
        out_dim: the descriptor size D.
        cfg: preprocessing and provenance (recipe, licence, paper, code, recorded metrics, notes).
        repo_id: ``<owner>/<repo>`` for the loading snippet (else a ``local-dir:`` one).
        license: overrides ``cfg.license`` (a model trained here carries the licence its data and
            backbone allow: say it).
        run_summary / test_results: the run's files (:func:`read_results_file`), for the results table.
    """
    backbone, head = dict(spec["backbone"]), dict(spec["head"])
    head_class = str(head.get("_target_", "?")).rsplit(".", 1)[-1]
    backbone_name = str(backbone.get("model_name", str(backbone.get("_target_", "?")).rsplit(".", 1)[-1]))
    licence_text = license or (cfg.license if cfg is not None else None)
    title = (cfg.name if cfg is not None and cfg.architecture else None) or architecture or f"{head_class} on {backbone_name}"
    tags = [*_TAGS, head_class.lower(), backbone_name.split(".")[0]]
    data = ModelCardData(library_name="aggzoo", pipeline_tag="image-feature-extraction", tags=tags,
                         **hf_license(licence_text))
    load = f"hf-hub:{repo_id}" if repo_id else "local-dir:<this folder>"
    lines = [f"# {title}", "",
             f"A visual place recognition model of aggzoo (`pip install aggzoo`): the {head_class} aggregation head on a "
             f"`{backbone_name}` backbone, giving one L2-normalised {out_dim or '?'}-D descriptor per image.", "",
             "## Use", "", "```python", "import aggzoo", "",
             f'model = aggzoo.create_model("{load}")  # weights: model.safetensors, spec: config.json',
             "descriptors = model(images)  # [B, 3, H, W] -> [B, D], unit norm", "```", ""]
    if cfg is not None:
        lines += [f"Preprocessing: RGB in [0, 1], resized to {cfg.input_size[1]} x {cfg.input_size[2]} (H x W, "
                  f"{cfg.interpolation}), normalised with mean {list(cfg.mean)} and std {list(cfg.std)}.", ""]
    lines += ["## Model", "", "| architecture | head | backbone | D |", "|---|---|---|---:|",
              f"| {architecture or '-'} | {head_class} | {backbone_name} | {out_dim or '?'} |", ""]
    recipe = cfg.recipe if cfg is not None and cfg.recipe else None
    if recipe is None and run_summary is not None:
        recipe = " ".join(["aggzoo-train", *run_summary.get("overrides", [])])
    if recipe:
        lines += ["## Recipe", "", f"`{recipe}`", ""]
        if run_summary is not None:
            facts = {k: run_summary.get(k) for k in ("epochs", "global_step", "image_size", "images_per_step",
                                                    "wall_seconds") if run_summary.get(k) is not None}
            lines += [", ".join(f"{k}: {v}" for k, v in facts.items()), ""] if facts else []
    rows = _result_rows(run_summary, test_results)
    if rows:
        lines += ["## Results of the run", "", "Recall@k in percent, as the run measured it.", "",
                  *_results_table(rows), ""]
    if cfg is not None and cfg.metrics:
        lines += ["## Recorded metrics", "", "As published by the authors or as measured by the recipe (percent).", "",
                  "| metric | value |", "|---|---:|", *(f"| {k} | {v:g} |" for k, v in cfg.metrics.items()), ""]
    lines += ["## Licence and sources", "", f"- Licence: {licence_text or 'not stated'}"]
    if cfg is not None:
        lines += [f"- {label}: {value}" for label, value in (("Paper", cfg.paper), ("Code", cfg.code),
                                                             ("Notes", cfg.notes)) if value]
    content = f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines) + "\n"
    return ModelCard(content)
