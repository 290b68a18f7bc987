"""A command line that Hydra cannot compose (``head=nosuch``, ``foo=1`` without ``+``, ``x=[1``) is a
user error too: one ``error:`` line with what the valid choices are, and exit status 2.

Hydra catches its own composition errors inside ``@hydra.main``, prints them over several lines
(with its config search path) and exits with status 1, before the task function, and so before
:func:`~aggzoo.cli.reporting.reported_user_errors`, can see them. Hydra re-raises instead when
``HYDRA_FULL_ERROR`` is set, which is the one public switch it has: :func:`run_hydra_main` sets it
for the call and turns the composition errors (and only those) into one line. Everything else keeps
Hydra's behaviour: ``--help``, ``--cfg job``, ``-m`` sweeps, and a bug's traceback (now complete).
A user who set ``HYDRA_FULL_ERROR=1`` themselves gets Hydra's own output unchanged.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

from hydra.errors import ConfigCompositionException, OverrideParseException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from aggzoo.cli.reporting import disk_full_message, exit_with_user_error, is_disk_full

__all__ = ["composition_message", "run_hydra_main"]

_ENV = "HYDRA_FULL_ERROR"
#: the lines after these headings are Hydra's config search path, not something the user can act on
_SEARCH_PATH = re.compile(r"^(Config search path|Search path):\s*$")


def run_hydra_main(main: Callable[[], Any], script: str) -> None:
    """Call the ``@hydra.main`` function ``main`` of ``script`` (``"train.py"``); a command line
    that cannot be composed prints ``error: <what is wrong> ...`` and exits with status 2."""
    if os.environ.get(_ENV):  # the user asked for Hydra's complete stack traces
        main()
        return
    os.environ[_ENV] = "1"
    try:
        main()
    except (ConfigCompositionException, OverrideParseException) as err:
        # No run folder exists yet; Hydra's console handler (a multirun sets it up) would print it twice.
        exit_with_user_error(composition_message(err, script), to_log=False)
    except OSError as err:
        if not is_disk_full(err):
            raise
        # Hydra's own writes (.hydra/ of the run folder) before the job's code runs.
        exit_with_user_error(disk_full_message(err), to_log=False)


def composition_message(err: BaseException, script: str) -> str:
    """One line from Hydra's several: its message, the options it lists joined by commas, the
    valid keys where a key is unknown, and where to read more."""
    text = _one_line(str(err))
    cause = err.__cause__
    if isinstance(cause, OmegaConfBaseException):
        text = f"{text} ({_one_line(str(cause).split('full_key:', 1)[0])})"
        parent = getattr(cause, "parent_node", None)
        if isinstance(parent, DictConfig) and len(parent) > 0:
            where = parent._get_full_key(None) or "the top level"
            text += f"; the keys of {where} are: {', '.join(str(k) for k in parent.keys())}"
    if isinstance(err, OverrideParseException):
        text = f"cannot parse the override {err.override!r}: {text}{_quoting_hint(err.override)}"
    command = f"python {script}" if script.endswith(".py") else script  # train.py or aggzoo-train
    return f"{text}. See {command} --help for the config groups and their options"


#: characters of a plain path that Hydra's grammar reads only inside quotes
_NEEDS_QUOTES = re.compile(r"[\s=,:\[\]{}()'\"\\]|[^\x00-\x7f]")


def _quoting_hint(override: str) -> str:
    """How to quote a value (a path with spaces, ``=`` or non-ASCII letters) that Hydra could not parse."""
    key, equals, value = override.partition("=")
    if not equals:  # the shell split an unquoted path at a space: this word is its tail
        return ("; a value with spaces must be quoted twice, for the shell and for Hydra: \"queries='/my photos/q'\"")
    if value and value[0] not in "'\"" and _NEEDS_QUOTES.search(value) and "'" not in value:
        return f"; quote the value for Hydra, and the whole override for the shell: \"{key}='{value}'\""
    return ""


def _one_line(text: str) -> str:
    """Hydra's multi-line message as one line: the search path dropped, a list of options after a
    heading ending in ``:`` joined by commas."""
    parts: list[str] = []
    listing = False
    for raw in text.splitlines():
        line = raw.strip()
        if _SEARCH_PATH.match(line):
            break
        if not line:
            continue
        if raw.startswith("\t") and listing:  # one option of a list ("\ta2gc")
            parts[-1] += ("" if parts[-1].endswith(":") else ",") + " " + line
            continue
        listing = line.endswith(":")
        parts.append(line.rstrip("."))
    return "; ".join(parts).rstrip(".")
