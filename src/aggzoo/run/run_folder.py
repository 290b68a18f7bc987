"""The run folder must be writable before Hydra starts a job.

Hydra creates ``hydra.run.dir`` (``<paths.log_dir>/<task>/runs/<time>``) or ``hydra.sweep.dir``
itself, before ``train.py`` / ``eval.py`` run any of aggzoo's code: a read-only or foreign log folder
would end in Hydra's traceback of ``os.mkdir``. :class:`WritableRunFolder` (a Hydra callback,
``conf/hydra/default.yaml``) makes and probes the folder's parent first, and stops with one
``error:`` line naming the folder and the override that moves it (exit status 2, as every user
error of the entry points).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

__all__ = ["WritableRunFolder", "unwritable_folder_message"]

#: Exit status of a user error (``aggzoo.cli.reporting.USER_ERROR_STATUS``).
_USER_ERROR_STATUS = 2


def unwritable_folder_message(folder: Path) -> str | None:
    """Why ``folder`` (created if missing) cannot hold a run, or ``None`` when a file can be written in it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            return None
    except OSError as error:
        # The folder Hydra or this probe could not create, or the probe file inside ``folder``.
        where = "" if error.filename is None or Path(error.filename).parent == folder else f"{error.filename}: "
        return f"cannot write the run folder {folder} ({where}{error.strerror or error})"


class WritableRunFolder(Callback):
    """Hydra callback: refuse to start a run (or a sweep) whose folder cannot be written."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(config, "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(config, "hydra.sweep.dir")

    @staticmethod
    def _check(config: DictConfig, key: str) -> None:
        folder = OmegaConf.select(config, key, default=None)
        if folder is None:
            return
        # The parent: the run folder's own name holds the time, which Hydra resolves again later.
        message = unwritable_folder_message(Path(str(folder)).parent)
        if message is not None:
            print(f"error: {message}. Write the logs to a folder you can write with paths.log_dir=<folder>, or "
                  "make this one writable", file=sys.stderr)
            raise SystemExit(_USER_ERROR_STATUS)
