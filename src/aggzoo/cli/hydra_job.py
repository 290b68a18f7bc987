"""The two Hydra jobs' shared entry point: :func:`hydra_job` makes a job's ``@hydra.main`` function
and its console ``main`` (:mod:`aggzoo.cli.train`, :mod:`aggzoo.cli.eval`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import hydra
from omegaconf import DictConfig

import aggzoo.run.config_schema  # noqa: F401  (typed schema: a wrong override type fails at composition)
from aggzoo.cli import CONFIG_DIR
from aggzoo.cli.hydra_errors import run_hydra_main
from aggzoo.cli.quiet import quiet_startup_noise
from aggzoo.cli.reporting import reported_user_errors
from aggzoo.run.evaluation_keys import migrate_overrides

__all__ = ["hydra_job"]

# paths.root_dir (conf/paths/default.yaml): the folder the job is launched from, unless set.
os.environ.setdefault("AGGZOO_ROOT", os.getcwd())


def hydra_job(config_name: str, run: str, command: str) -> tuple[Callable[[], None], Callable[[str], None]]:
    """``(job, main)`` for the job composed from ``conf/<config_name>.yaml`` that calls
    ``aggzoo.run.pipeline.<run>(cfg)``.

    ``run`` names the job function: ``train`` (:func:`aggzoo.run.pipeline.train`) or ``evaluate``
    (:func:`aggzoo.run.evaluate.evaluate`).

    ``job`` is the ``@hydra.main`` function: a user's mistake prints one ``error:`` line, exit status 2,
    and in a multirun (``-m``) a failed job is recorded and the sweep goes on, ending with its table
    (conf/hydra/default.yaml: callbacks). ``main(script=command)`` is the console entry point: ``job``
    with a command line Hydra cannot compose (``head=nosuch``, an unknown key) reported the same way,
    naming ``script``'s ``--help``.
    """

    @hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name=config_name)
    def job(cfg: DictConfig) -> None:
        quiet_startup_noise()  # faiss's failed AVX loads, Lightning's adverts (aggzoo.cli.quiet)
        from aggzoo.run import evaluate, pipeline
        from aggzoo.run.sweep import keep_sweeping

        with reported_user_errors(), keep_sweeping():
            {"train": pipeline.train, "evaluate": evaluate.evaluate}[run](cfg)

    def main(script: str = command) -> None:
        # the flat evaluation.* keys of earlier versions, moved to their sub-node with a warning
        sys.argv[1:] = migrate_overrides(sys.argv[1:])
        run_hydra_main(job, script)

    return job, main
