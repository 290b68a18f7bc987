"""Running aggzoo's real entry points (``train.py``, ``eval.py``, ``python -m aggzoo.cli.*``) as a user
does, and checking what the user sees when they get something wrong."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

#: seconds-sized train.py overrides: tiny synthetic city, tiny random backbone, small images, no logs
TINY_TRAIN = ["synthetic=tiny", "backbone=test_resnet", "head=gem", "data.image_size=[48,64]",
              "data.eval_image_size=[48,64]", "data.places_per_batch=4", "trainer.max_epochs=1",
              "trainer.accelerator=cpu", "logger=csv_only", "evaluate_baseline=false",
              "callbacks.progress_bar.refresh_rate=0"]
#: the same for eval.py (the untrained model of the config unless ckpt_path is given)
TINY_EVAL = ["synthetic=tiny", "backbone=test_resnet", "image_size=[48,64]"]


def run_entry(args: Sequence[str], tmp: Path, *, script: str | None = "train.py",
              env: Mapping[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python <script> <args>`` (or ``python <args>`` with ``script=None``, e.g. ``["-m",
    "aggzoo.cli.export", ...]``) in the repository, with the data and log folders under ``tmp``.

    Hydra entry points get ``paths.log_dir=<tmp>/logs``; the data folder is ``<tmp>/data`` unless
    ``env`` sets ``AGGZOO_DATA``. The subprocess imports this checkout's ``src`` (and ``tests``).
    """
    pythonpath = os.pathsep.join(p for p in (str(REPO / "src"), str(REPO / "tests"), os.environ.get("PYTHONPATH"))
                                 if p)
    full_env = dict(os.environ, AGGZOO_DATA=str(tmp / "data"), AGGZOO_ROOT=str(REPO), AGGZOO_OFFLINE="1",
                    AGGZOO_CACHE=str(tmp / "cache"), NO_ALBUMENTATIONS_UPDATE="1", PYTHONUNBUFFERED="1",
                    PYTHONPATH=pythonpath)
    full_env.pop("HYDRA_FULL_ERROR", None)
    full_env.update(env or {})
    command = [sys.executable, *([str(REPO / script)] if script else []), *args]
    if script in ("train.py", "eval.py") and not any(a.startswith("paths.log_dir=") for a in args):
        command.append(f"paths.log_dir={tmp / 'logs'}")
    return subprocess.run(command, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout)


def error_line(result: subprocess.CompletedProcess) -> str:
    """The one ``error: ...`` line of a run refused for a user error (exit status 2, no traceback);
    the assertion message shows the whole output otherwise."""
    shown = f"exit {result.returncode}\n--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-6000:]}"
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2, shown
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout, shown
    assert len(lines) == 1, shown
    assert result.stderr.count(lines[0].removeprefix("error: ")) == 1, shown  # said once, not logged again
    assert "weights_only=False" not in result.stderr + result.stdout, shown
    if log := os.environ.get("AGGZOO_ERROR_LINES"):  # collect what users see (for an issue note)
        with open(log, "a") as handle:
            handle.write(" ".join(str(a) for a in result.args[1:]) + "\n    " + lines[0] + "\n")
    return lines[0]


def started_ahead(request: Any, test_name: str, make_run: Callable[..., tuple[list[str], dict[str, Any]]],
                  tmp_factory: Any, *, workers: int = 2) -> Iterator[dict[str, Future]]:
    """Start the entry-point run of every selected case of the parametrized ``test_name`` ahead,
    ``workers`` processes at a time, for a module fixture to yield; a case then waits for its own
    ``futures[request.node.callspec.id].result()``.

    Each run is mostly interpreter and torch start-up on one core, so two at a time take about half the
    wall time of one after another. ``make_run(**case_params)`` returns ``(args, run_entry keyword
    arguments)``; each run gets its own temporary folder. Only the cases pytest selected start (``-k``,
    ``-m`` and node ids are honoured), in collection order.
    """
    pool = ThreadPoolExecutor(max_workers=workers)
    futures: dict[str, Future] = {}
    for item in request.session.items:
        if getattr(item, "originalname", None) == test_name and hasattr(item, "callspec"):
            args, kwargs = make_run(**item.callspec.params)
            futures[item.callspec.id] = pool.submit(run_entry, args, tmp_factory.mktemp("run"), **kwargs)
    try:
        yield futures
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
