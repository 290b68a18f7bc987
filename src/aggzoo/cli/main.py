"""``aggzoo <command> ...``: one console command for everything that is not a Hydra job.

    aggzoo models [pattern]        the registered weights (a Markdown table); --architectures for the names
    aggzoo info <name>             one name's PretrainedCfg: paper, licence, D, protocol, source, results
    aggzoo export <name> --format onnx|torchscript|export [...]   export with a parity check
    aggzoo manifest add|verify ...                                the shipped-weights manifest
    aggzoo demo [model=<name>] [database=<folder>] [...]           the Gradio search page (extra: demo)
    aggzoo vocabulary <model> <image folder> --out <file>         fit a vocabulary (AnyLoc) from images

Training and evaluation are Hydra jobs with their own commands: ``aggzoo-train [key=value ...]`` and
``aggzoo-eval [key=value ...]`` (``python train.py`` / ``python eval.py`` in a checkout).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

__all__ = ["COMMANDS", "main"]

#: command -> (module, function, one-line help). Each module is imported only when its command runs,
#: so ``aggzoo --help`` does not import torch, and ``aggzoo models`` does not import an exporter.
COMMANDS = {
    "models": ("aggzoo.cli.models", "main", "list the registered weights (or --architectures)"),
    "info": ("aggzoo.cli.models", "info_main", "show one name's PretrainedCfg (paper, licence, D, protocol, results)"),
    "export": ("aggzoo.cli.export", "main", "export a model to ONNX / TorchScript / torch.export, with a parity check"),
    "manifest": ("aggzoo.cli.manifest", "main", "add or verify entries of the shipped-weights manifest"),
    "demo": ("aggzoo.cli.demo", "main", "the Gradio page: a query against a database folder (pip install 'aggzoo[demo]')"),
    "vocabulary": ("aggzoo.cli.vocabulary", "main", "fit a model's vocabulary (AnyLoc's VLAD centres) from a folder of images"),
}


def main(argv: Sequence[str] | None = None) -> int:
    """``aggzoo <command> ...``: dispatch to the command's module (:data:`COMMANDS`); the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="aggzoo", description=__doc__.split("\n")[0],
                                     epilog="Hydra jobs: aggzoo-train [key=value ...], aggzoo-eval [key=value ...]")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(COMMANDS) + "}")
    for name, (_, _, help_text) in COMMANDS.items():
        # Each command parses its own arguments (add_help=False: its --help is its own parser's).
        sub.add_parser(name, help=help_text, add_help=False)
    args = parser.parse_args(argv[:1])
    module, function, _ = COMMANDS[args.command]
    try:
        status = getattr(importlib.import_module(module), function)(argv[1:], prog=f"aggzoo {args.command}")
        sys.stdout.flush()  # here, not at exit: a reader that has gone (aggzoo models | head) is met below
    except BrokenPipeError:
        # The reader closed the pipe, as `head` does: what it did not read is not wanted. Later writes go
        # to /dev/null, so the interpreter's own flush at exit has nothing to complain about.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return status


if __name__ == "__main__":
    raise SystemExit(main())
