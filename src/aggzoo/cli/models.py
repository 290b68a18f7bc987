"""``aggzoo models [pattern]``: the registered weights as a Markdown table (name, descriptor size,
input size, source, licence, recorded R@1); ``aggzoo info <name>``: everything one name's
:class:`~aggzoo.hub.cfg.PretrainedCfg` records (also ``python -m aggzoo.cli.models [pattern]``)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from aggzoo.cli.reporting import reported_user_errors
from aggzoo.hub.cfg import PretrainedCfg, split_metric_key, split_name
from aggzoo.hub.factory import create_model, is_model, list_models, list_pretrained, model_entrypoint
from aggzoo.hub.registry import get_pretrained_cfg
from aggzoo.run.model_by_name import model_to_evaluate

__all__ = ["describe", "info_main", "main", "pretrained_table"]


def pretrained_table(pattern: str = "*") -> str:
    """A Markdown table of the weights matching ``pattern``: descriptor size, input size, source,
    licence and the recorded R@1 figures; where any of them records per-setup mAP (revisited Oxford / Paris), a
    column of those too."""
    cfgs = list_pretrained(pattern, with_cfg=True)
    maps = [_setup_maps(cfg) for cfg in cfgs]
    with_map = any(maps)
    header = ["name", "D", "input", "source", "licence", "R@1 (published or measured)"] + (["mAP (published)"] * with_map)
    rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for cfg, setup_maps in zip(cfgs, maps):
        recalls = ", ".join(f"{k.removesuffix('/R@1')} {v:g}" for k, v in cfg.metrics.items() if k.endswith("/R@1"))
        size = "x".join(str(v) for v in cfg.input_size[1:])
        cells = [cfg.name, cfg.out_dim or "?", size, cfg.source, cfg.license or "?", recalls or "-"]
        cells += [setup_maps or "-"] * with_map
        rows.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(rows)


def _setup_maps(cfg: PretrainedCfg) -> str:
    """``"roxford5k M 67.3 H 44.3, rparis6k M 80.6 H 61.5"``: the cfg's ``<benchmark>/<setup>/mAP`` figures."""
    by_benchmark: dict[str, list[str]] = {}
    for key, value in cfg.metrics.items():
        benchmark, setup, metric = split_metric_key(key)
        if setup is not None and metric == "mAP":
            by_benchmark.setdefault(benchmark, []).append(f"{setup[0].upper()} {value:g}")
    return ", ".join(f"{benchmark} {' '.join(values)}" for benchmark, values in by_benchmark.items())


def describe(name: str) -> str:
    """What ``name`` is: an ``<architecture>.<tag>``'s PretrainedCfg (paper, licence, code, D, the
    evaluation protocol -- input size, resize, normalisation --, weight source and sha256, recipe, the
    recorded results), or an architecture's summary and its tags."""
    if not is_model(name) and (name.startswith(("local-dir:", "hf-hub:")) or "/" in name or Path(name).exists()):
        return _describe_file(name)
    architecture, tag = split_name(name)
    summary = (model_entrypoint(architecture).__doc__ or architecture).strip().splitlines()[0]
    if tag is None:
        tags = list_pretrained(f"{architecture}.*")
        lines = [f"{architecture}: {summary}", f"  weights: {', '.join(tags) if tags else '(none registered)'}"]
        return "\n".join(lines + ([f"  aggzoo info {tags[0]} for one of them"] if tags else []))
    return _describe_cfg(get_pretrained_cfg(name), f"{architecture} ({summary})")


def _describe_file(name: str) -> str:
    """A checkpoint, run folder, ``save_pretrained`` folder (or ``local-dir:`` / ``hf-hub:``): the model it
    builds (loaded by the one safe reader, as ``eval.py model=`` loads it) and the PretrainedCfg it records."""
    resolved = model_to_evaluate(name, Path("logs") / "train", key="name")
    model = create_model(resolved, pretrained=True)
    architecture = getattr(model, "aggzoo_architecture", None) or type(model).__name__
    backbone = getattr(getattr(model, "backbone", None), "model_name", None) or type(getattr(model, "backbone", model)).__name__
    what = f"{architecture} ({type(getattr(model, 'head', model)).__name__} head on {backbone}; read from {resolved})"
    cfg = getattr(model, "pretrained_cfg", None)
    if cfg is None:
        return "\n".join([name, f"  architecture  {what}", f"  descriptor D  {model.out_dim}",
                          "  (no PretrainedCfg recorded: evaluated with eval.py's image_size and the pipeline's resize)"])
    return _describe_cfg(cfg, what, title=name)


def _describe_cfg(cfg: PretrainedCfg, architecture: str, *, title: str | None = None) -> str:
    rows = [
        ("architecture", architecture),
        ("paper", cfg.paper), ("code", cfg.code), ("licence", cfg.license),
        ("descriptor D", cfg.out_dim),
        ("protocol", f"input {cfg.input_size[1]} x {cfg.input_size[2]} (H x W), {cfg.interpolation} resize, "
                     f"mean {list(cfg.mean)}, std {list(cfg.std)}"),
        ("weights", cfg.source), ("sha256", cfg.sha256 or "(not pinned)"),
        ("contents", cfg.contents), ("key remap", cfg.remap_name),
        ("model kwargs", dict(cfg.model_kwargs) or None),
        ("recipe", cfg.recipe), ("notes", cfg.notes),
    ]
    width = max(len(label) for label, _ in rows)
    lines = [title or cfg.name] + [f"  {label.ljust(width)}  {value}" for label, value in rows if value not in (None, "")]
    if cfg.metrics:
        lines += ["  results (percent, as published or measured by the recipe):"]
        lines += [f"    {key}: {value:g}" for key, value in cfg.metrics.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, prog: str = "python -m aggzoo.cli.models") -> int:
    """``aggzoo models [pattern]``: print the registered weights (``--architectures``: the architectures); the exit status."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    parser.add_argument("pattern", nargs="?", default="*", help="glob over <architecture>.<tag> names (default: all)")
    parser.add_argument("--architectures", action="store_true",
                        help="list the registered architectures (<head>_<backbone>) instead of the weights")
    args = parser.parse_args(argv)
    with reported_user_errors():  # a broken shipped-weights manifest
        print("\n".join(list_models(args.pattern)) if args.architectures else pretrained_table(args.pattern))
    return 0


def info_main(argv: Sequence[str] | None = None, prog: str = "aggzoo info") -> int:
    """``aggzoo info <name>``: print the PretrainedCfg of a name; the exit status."""
    parser = argparse.ArgumentParser(prog=prog, description=describe.__doc__.split("\n")[0])
    parser.add_argument("name", help="<architecture>.<tag> (weights) or <architecture> (see `aggzoo models`), or a "
                                     "checkpoint, run folder, save_pretrained folder, local-dir:<folder>")
    args = parser.parse_args(argv)
    with reported_user_errors():  # an unknown name: one line with the closest names
        print(describe(args.name))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
