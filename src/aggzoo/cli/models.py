"""``python -m aggzoo.cli.models [pattern]``: the registered weights as a Markdown table (name,
descriptor size, input size, source, licence, recorded R@1)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from aggzoo.cli.reporting import reported_user_errors
from aggzoo.hub.factory import list_pretrained

__all__ = ["main", "pretrained_table"]


def pretrained_table(pattern: str = "*") -> str:
    """A Markdown table of the weights matching ``pattern``: descriptor size, input size, source,
    licence and the recorded R@1 figures."""
    rows = ["| name | D | input | source | licence | R@1 (published or measured) |", "|---|---|---|---|---|---|"]
    for cfg in list_pretrained(pattern, with_cfg=True):
        recalls = ", ".join(f"{k.removesuffix('/R@1')} {v:g}" for k, v in cfg.metrics.items() if k.endswith("/R@1"))
        size = "x".join(str(v) for v in cfg.input_size[1:])
        cells = [cfg.name, cfg.out_dim or "?", size, cfg.source, cfg.license or "?", recalls or "-"]
        rows.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m aggzoo.cli.models", description=__doc__.split("\n")[0])
    parser.add_argument("pattern", nargs="?", default="*", help="glob over <architecture>.<tag> names (default: all)")
    args = parser.parse_args(argv)
    with reported_user_errors():  # a broken shipped-weights manifest
        print(pretrained_table(args.pattern))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
