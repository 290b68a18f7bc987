"""Hydra multiruns of ``train.py`` and ``eval.py``: every job runs, and the sweep ends with its table.

    python train.py -m head=gem,netvlad,boq trainer.max_epochs=3
    python eval.py -m ckpt_path=a.ckpt,b.ckpt benchmark=[pitts30k_test,msls_val]

- :func:`keep_sweeping` wraps a multirun job: a job that fails (a user error or a bug) is logged,
  recorded as ``run_error.txt`` in its folder, and the sweep goes on to the next job instead of
  stopping at the first failure (Hydra's basic sweeper would raise only after the batch, and a
  user error's ``SystemExit`` would end the whole sweep at once).
- :class:`SweepSummary`, a Hydra callback (``callbacks`` in ``conf/hydra/default.yaml``, which
  ``train.yaml`` and ``eval.yaml`` both use), prints the table of
  :func:`aggzoo.run.collect_runs.format_runs` when the sweep ends, writes it to
  ``<sweep dir>/sweep_results.md``, and exits with status 1 when any job failed.

Outside a multirun both do nothing: a single run fails as it always does.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from aggzoo.errors import UserError, user_message
from aggzoo.run.collect_runs import ERROR_FILE, collect_runs, common_overrides, format_runs

__all__ = ["SweepSummary", "keep_sweeping"]

log = logging.getLogger(__name__)

TABLE_FILE = "sweep_results.md"


def _multirun_job_dir() -> Path | None:
    """This job's output folder when it runs inside a Hydra multirun, else None."""
    if not HydraConfig.initialized():
        return None
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.MULTIRUN:
        return None
    return Path(hydra_cfg.runtime.output_dir)


@contextmanager
def keep_sweeping() -> Iterator[None]:
    """In a multirun job, record a failure in ``<job dir>/run_error.txt`` and return normally.

    The file's first line is the one-line reason (a user error's message, or the exception type and
    message of a bug); a bug's traceback follows. ``KeyboardInterrupt`` still stops the sweep.
    """
    job_dir = _multirun_job_dir()
    try:
        yield
    except Exception as err:
        if job_dir is None:  # a single run fails as it always does
            raise
        if isinstance(err, UserError):
            reason, details = user_message(err), ""
            log.error("error: %s", reason)
        else:
            # One line, whole: a wrapped error (Hydra's InstantiationException) has its cause on line two.
            reason = " ".join(f"{type(err).__name__}: {err}".split())
            details = "".join(traceback.format_exception(err))
            log.error("job failed:\n%s", details)
        job_dir.mkdir(parents=True, exist_ok=True)
        (job_dir / ERROR_FILE).write_text(f"{reason}\n\n{details}")


class SweepSummary(Callback):
    """Hydra callback: the comparison table of a finished ``train.py`` or ``eval.py`` multirun.

    Args:
        ks: Recall@k columns.
        sort: column to sort by, largest first (``"R@1"``: the first test benchmark's R@1); None keeps
            the job order.
    """

    def __init__(self, ks: Sequence[int] = (1, 5, 10), sort: str | None = "R@1") -> None:
        self.ks = tuple(int(k) for k in ks)
        self.sort = sort

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        runs = collect_runs(sweep_dir)
        try:
            table = format_runs(runs, ks=self.ks, sort=self.sort)
        except ValueError:  # no such column: no run reached its test benchmarks
            table = format_runs(runs, ks=self.ks)
        (sweep_dir / TABLE_FILE).write_text(table + "\n")
        print(f"\n== sweep {sweep_dir}: {len(runs)} runs (also in {TABLE_FILE}) ==\n{table}", flush=True)
        failed = [r for r in runs if r["status"] != "done"]
        if failed:
            common = common_overrides(runs)
            listed = "; ".join(f"run {r['run']} ({' '.join(o for o in r.get('overrides', []) if o not in common)}): "
                               f"{r['status']}" for r in failed)
            raise SystemExit(f"error: {len(failed)} of {len(runs)} sweep runs did not finish: {listed}")
