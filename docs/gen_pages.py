"""The pages of the documentation site that describe code, generated from the code at build time.

``mkdocs build`` runs this file (the ``gen-files`` plugin, ``mkdocs.yml``), so these pages cannot go
stale: a moved module, a new method file, a new config or a re-measured shipped model appears on the
next build. It writes

- ``reference/``: one API page per module of ``src/aggzoo`` (found by walking the folder; mkdocstrings
  renders them from the source, statically);
- ``zoo/``: one page per method file of ``aggzoo.zoo`` (found through the registry: its architectures,
  their descriptor size, and every tag's ``PretrainedCfg``: source, licence, paper, code, input size and
  protocol, converter, published figures, recipe) and an index of every registered name;
- ``config/``: one page per Hydra config group of ``conf/`` (every option file, as it is);
- ``results/shipped-weights.md``: the shipped weights' measured figures, from ``weights/manifest.json``;
- ``SUMMARY.md`` files for the navigation (literate-nav).

It also warns (and ``mkdocs build --strict`` fails) on every function or class a module exports in
``__all__`` without a docstring. The page builders are plain functions of their inputs, so the tests
call them directly (``tests/test_docs.py``).
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
CONF = REPO / "conf"
MANIFEST = REPO / "weights" / "manifest.json"

# A logger under "mkdocs." counts towards --strict's warnings.
log = logging.getLogger("mkdocs.plugins.aggzoo_docs")


# -- API reference -------------------------------------------------------------------------------------


def api_modules(src: Path = SRC) -> list[str]:
    """Every module of the package under ``src`` (``aggzoo``, ``aggzoo.hub.cfg``, ...), sorted."""
    names = []
    for path in sorted((src / "aggzoo").rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        elif parts[-1].startswith("_") or parts[-1] == "__main__":
            continue
        names.append(".".join(parts))
    return names


def api_page(module: str) -> str:
    """The reference page of one module (rendered by mkdocstrings)."""
    return f"# `{module}`\n\n::: {module}\n"


def undocumented_exports(src: Path = SRC) -> list[str]:
    """Functions and classes named in a module's ``__all__`` that have no docstring (read statically by griffe)."""
    import griffe

    package = griffe.load("aggzoo", search_paths=[str(src)], resolve_aliases=False)
    missing: list[str] = []

    def walk(module: Any) -> None:
        for name in module.exports or ():
            member = module.members.get(str(name))
            if member is None or member.is_alias:
                continue
            if (member.is_function or member.is_class) and not member.docstring:
                missing.append(member.path)
        for member in module.members.values():
            if not member.is_alias and member.is_module:
                walk(member)

    walk(package)
    return sorted(missing)


# -- the zoo -------------------------------------------------------------------------------------------


def _first_paragraph(doc: str | None) -> str:
    return " ".join((doc or "").strip().split("\n\n")[0].split())


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _protocol(cfg: Any) -> str:
    size = "x".join(str(s) for s in cfg.input_size[1:])
    return (f"{size} ({cfg.eval_resize} resize, {cfg.interpolation}), mean {list(cfg.mean)}, std {list(cfg.std)}, "
            f"search `{cfg.eval_metric}`")


def tag_section(cfg: Any) -> str:
    """One set of weights (a ``PretrainedCfg``) as a Markdown section."""
    rows = [
        ("source", cfg.source),
        ("descriptor size D", cfg.out_dim),
        ("input size and protocol", _protocol(cfg)),
        ("converter (key rules of the checkpoint)", f"`{cfg.remap_name}`" if cfg.remap_name else "none (aggzoo's own keys)"),
        ("contents", cfg.contents),
        ("paper", cfg.paper),
        ("code", cfg.code),
        ("licence", cfg.license),
        ("recipe", cfg.recipe),
        ("sha256", f"`{cfg.sha256}`" if cfg.sha256 else "not pinned"),
        ("notes", cfg.notes),
    ]
    lines = [f"### `{cfg.name}`", "", "| | |", "|---|---|"]
    lines += [f"| {key} | {_cell(value)} |" for key, value in rows if value not in (None, "")]
    if cfg.metrics:
        lines += ["", "Figures (Recall@k in percent, as published for official weights, as measured for shipped ones):", "",
                  "| benchmark / metric | value |", "|---|---|"]
        lines += [f"| `{key}` | {value} |" for key, value in sorted(cfg.metrics.items())]
    lines += ["", "```python", f'model = aggzoo.create_model("{cfg.name}", pretrained=True)', "```", ""]
    return "\n".join(lines)


def method_page(module: Any, architectures: Mapping[str, Any], cfgs: Mapping[str, list[Any]],
                out_dims: Mapping[str, int | None]) -> str:
    """The page of one method file: its docstring, then each architecture and each of its tags.

    ``architectures`` maps a registered name to its entry point, ``cfgs`` a name to its ``PretrainedCfg``s,
    ``out_dims`` a name to the descriptor size of the model it builds (``None`` when unknown).
    """
    doc = (module.__doc__ or "").strip()
    title, _, rest = doc.partition("\n")
    lines = [f"# {title or module.__name__}", "", f"Method file: `{module.__name__}`", ""]
    if rest.strip():
        lines += [rest.strip(), ""]
    for name in sorted(architectures):
        fn = architectures[name]
        lines += [f"## `{name}`", "", _first_paragraph(fn.__doc__) or "(no docstring)", ""]
        if out_dims.get(name):
            lines += [f"Descriptor size of the architecture at its defaults: D = {out_dims[name]}.", ""]
        lines += ["```python", f'model = aggzoo.create_model("{name}")', "```", ""]
        tags = cfgs.get(name, [])
        if not tags:
            lines += ["No pretrained weights are registered for this architecture.", ""]
        for cfg in tags:
            lines.append(tag_section(cfg))
    return "\n".join(lines)


def _out_dim(name: str) -> int | None:
    import torch

    import aggzoo

    try:
        with torch.device("meta"):  # the architecture without allocating or initialising weights
            return int(aggzoo.create_model(name).out_dim)
    except Exception as error:  # noqa: BLE001 -- a page says "unknown" rather than failing the whole site
        log.warning("zoo page: cannot build %s on the meta device to read its descriptor size: %s", name, error)
        return None


def zoo_pages(*, out_dims: bool = True) -> dict[str, str]:
    """``{path under docs/: Markdown}`` for the zoo: ``zoo/index.md`` (every registered architecture and
    ``<arch>.<tag>`` name) and one ``zoo/<method>.md`` per module that registers architectures, read from
    the registry as it is now (the zoo is imported first)."""
    import aggzoo
    from aggzoo.hub import registry

    aggzoo.list_models()  # imports the zoo (hub.factory), which fills the registry
    by_module: dict[str, dict[str, Any]] = {}
    for name in registry.list_models():
        fn = registry.model_entrypoint(name)
        by_module.setdefault(fn.__module__, {})[name] = fn
    cfgs: dict[str, list[Any]] = {}
    for cfg in registry.list_pretrained(with_cfg=True):
        cfgs.setdefault(cfg.architecture, []).append(cfg)

    pages: dict[str, str] = {}
    index = ["# The zoo", "",
             "Every registered architecture (`<head>_<backbone>`) and every set of weights (`<arch>.<tag>`), "
             "generated from the registry (`aggzoo.list_models()`, `aggzoo.list_pretrained()`). "
             "`python -m aggzoo.cli.models` prints the same list; `python -m aggzoo.cli.models --architectures` "
             "the architectures.", "",
             "| method | architecture | weights (`<arch>.<tag>`) | D |", "|---|---|---|---|"]
    for module_name in sorted(by_module):
        module = sys.modules[module_name]
        stem = module_name.rpartition(".")[2]
        architectures = by_module[module_name]
        dims = {name: (_out_dim(name) if out_dims else None) for name in architectures}
        for name in architectures:
            known = [c.out_dim for c in cfgs.get(name, []) if c.out_dim]
            dims[name] = dims[name] or (known[0] if known else None)
        pages[f"zoo/{stem}.md"] = method_page(module, architectures, cfgs, dims)
        for name in sorted(architectures):
            tags = ", ".join(f"`{c.name}`" for c in cfgs.get(name, [])) or "—"
            index.append(f"| [{stem}]({stem}.md) | `{name}` | {tags} | {dims[name] or '?'} |")
    pages["zoo/index.md"] = "\n".join(index) + "\n"
    return pages


# -- config groups -------------------------------------------------------------------------------------


def _leading_comment(text: str) -> str:
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(line for line in lines if line)


def config_pages(conf: Path = CONF) -> dict[str, str]:
    """``config/<group>.md`` for every folder of ``conf/`` (each option file as it is, its leading comment
    as its description) and ``config/index.md`` with the primary configs (``train.yaml``, ``eval.yaml``)."""
    pages: dict[str, str] = {}
    index = ["# Config groups", "",
             "Generated from `conf/` (shipped inside the package as `aggzoo/conf`). Select an option with "
             "`<group>=<option>` on the command line of `python train.py` / `python eval.py`; "
             "`python train.py --cfg job` prints the composed config.", "", "| group | options |", "|---|---|"]
    groups = sorted(p for p in conf.rglob("*") if p.is_dir() and any(p.glob("*.yaml")))
    for group in groups:
        rel = group.relative_to(conf).as_posix()
        files = sorted(group.glob("*.yaml"))
        slug = rel.replace("/", "-")
        lines = [f"# `{rel}`", "", f"`{rel}=<option>`, from `conf/{rel}/`.", ""]
        for path in files:
            text = path.read_text()
            lines += [f"## `{path.stem}`", ""]
            if comment := _leading_comment(text):
                lines += [comment, ""]
            lines += ["```yaml", text.rstrip(), "```", ""]
        pages[f"config/{slug}.md"] = "\n".join(lines)
        index.append(f"| [`{rel}`]({slug}.md) | {', '.join(f'`{p.stem}`' for p in files)} |")
    for primary in sorted(conf.glob("*.yaml")):
        index += ["", f"## `conf/{primary.name}`", "", "```yaml", primary.read_text().rstrip(), "```"]
    pages["config/index.md"] = "\n".join(index) + "\n"
    return pages


# -- data formats ------------------------------------------------------------------------------------


def data_formats_page(modules: Iterable[str] | None = None) -> str:
    """Every module constant named ``*_LAYOUT`` / ``*_SOURCE`` (the layout a reader expects and where the data
    is published: the same text its errors show), one section per module."""
    import importlib

    lines = ["# Data formats: layouts", "",
             "Generated from the readers' own `*_LAYOUT` and `*_SOURCE` constants: the text a missing or malformed "
             "dataset's error shows.", ""]
    for name in modules if modules is not None else api_modules():
        path = SRC.joinpath(*name.split("."))
        source = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        if "_LAYOUT" not in source.read_text() and "_SOURCE" not in source.read_text():
            continue
        module = importlib.import_module(name)
        found = {k: v for k, v in vars(module).items()
                 if isinstance(v, str) and (k.endswith("_LAYOUT") or k.endswith("_SOURCE"))}
        if not found:
            continue
        lines += [f"## `{name}`", "", _first_paragraph(module.__doc__), ""]
        for key, value in sorted(found.items()):
            label = "layout" if key.endswith("_LAYOUT") else "where to get it"
            lines += [f"{label} (`{key.lstrip('_')}`):", "", "```text", value, "```", ""]
    return "\n".join(lines)


# -- results -------------------------------------------------------------------------------------------


def shipped_weights_page(entries: Iterable[Mapping[str, Any]]) -> str:
    """The shipped weights' recorded figures (``weights/manifest.json`` entries), with the commands that
    made and measured them; ``aggzoo info <name>`` prints the same record."""
    lines = ["# Shipped weights: recorded figures", "",
             "Generated from `weights/manifest.json`. Each figure is re-measured by the test suite "
             "(`tests/hub/test_shipped_weights.py`, within the entry's tolerance).", ""]
    for entry in entries:
        lines += [f"## `{entry['name']}`", ""]
        evaluation = entry.get("evaluation") or {}
        where = ", ".join(f"{k} {v}" for k, v in evaluation.items())
        if where:
            lines += [f"Measured on: {where}.", ""]
        metrics = entry.get("metrics") or {}
        if metrics:
            lines += ["| metric | value (%) |", "|---|---|"]
            lines += [f"| `{k}` | {v} |" for k, v in sorted(metrics.items())]
            lines.append("")
        for other in entry.get("off_domain") or ():
            recalls = ", ".join(f"{k} {v}" for k, v in other.get("recalls", {}).items())
            base = ", ".join(f"{k} {v}" for k, v in other.get("baseline_recalls", {}).items())
            lines += [f"Off its domain, on `{other.get('dataset')}` ({other.get('split')}): {recalls}; "
                      f"baseline `{other.get('baseline')}`: {base}.", ""]
            if other.get("command"):
                lines += ["```bash", other["command"], "```", ""]
        for key, label in (("recipe", "Recipe"), ("command", "Recorded with")):
            if entry.get(key):
                lines += [f"{label}:", "", "```bash", entry[key], "```", ""]
        if entry.get("notes"):
            lines += [entry["notes"], ""]
    return "\n".join(lines)


# -- the build -----------------------------------------------------------------------------------------


def all_pages() -> dict[str, str]:
    """Every generated page, ``{path under docs/: Markdown}``."""
    from mkdocs_gen_files import Nav

    nav = Nav()
    pages = {}
    for module in api_modules():
        parts = module.split(".")
        is_package = (SRC.joinpath(*parts) / "__init__.py").is_file()
        path = "/".join(parts) + ("/index.md" if is_package else ".md")
        pages[f"reference/{path}"] = api_page(module)
        nav[tuple(parts)] = path
    pages["reference/SUMMARY.md"] = "".join(nav.build_literate_nav())
    pages.update(zoo_pages())
    pages.update(config_pages())
    pages["data-formats.md"] = data_formats_page()
    entries = json.loads(MANIFEST.read_text()).get("entries", []) if MANIFEST.is_file() else []
    pages["results/shipped-weights.md"] = shipped_weights_page(entries)
    return pages


def main() -> None:
    import mkdocs_gen_files

    for path in undocumented_exports():
        log.warning("%s is exported in __all__ but has no docstring", path)
    for path, text in all_pages().items():
        with mkdocs_gen_files.open(path, "w") as handle:
            handle.write(text)


if __name__ == "<run_path>":  # run by mkdocs-gen-files (runpy.run_path); importing this file writes nothing
    sys.path.insert(0, str(SRC))
    main()
