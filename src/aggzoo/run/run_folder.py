"""The run folder: writable before Hydra starts a job, held by one live run, not left behind unused.

Hydra creates ``hydra.run.dir`` (``<paths.log_dir>/<task>/runs/<time>``) or ``hydra.sweep.dir``
itself, before ``train.py`` / ``eval.py`` run any of aggzoo's code: a read-only or foreign log folder
would end in Hydra's traceback of ``os.mkdir``. :class:`WritableRunFolder` (a Hydra callback,
``conf/hydra/default.yaml``) makes and probes the folder's parent first, and stops with one
``error:`` line naming the folder and the override that moves it (exit status 2, as every user
error of the entry points); so does a full file system (less than :data:`RUN_START_BYTES` free),
where Hydra's own write of ``.hydra/`` would end in a raw ``OSError``.

One live run per folder. Run folders are named to the microsecond (``conf/hydra/default.yaml``), so
two launches in the same second get two folders; a folder given twice (``hydra.run.dir=...``, or two
resumes of one run) is held by :func:`hold_run_folder`: an OS file lock (``filelock``, ``flock`` on
``<folder>/.run.lock``) taken for the run's life by :class:`RunFolderLock` (a Hydra callback, before
Hydra writes the folder's ``.hydra/``) and by the pipeline for the folder a resume continues in. The
operating system releases it when its process ends however it ends (``kill -9`` too), so a lock
file left by a dead run never blocks. A second run is refused with one ``error:`` line.

A dead run's folder is not free either: a folder that holds a training run (its ``checkpoints/`` or
``run_summary.json``), live or killed, is refused by :class:`RunFolderLock` to any command but the
one that resumes that run (``ckpt_path`` naming one of its checkpoints, the folder, ``last`` or
``auto``), before Hydra writes into it: a new run there would overwrite the run's saved config
(``.hydra/``) and summary, and the killed run could no longer be resumed with its own config. The
command that does resume it keeps the run's ``.hydra/`` as it is (Hydra is told not to write one),
so the run's record stays the run's.

:func:`discard_unused_run_folder` removes a folder that holds nothing but what Hydra writes into
every run folder (``.hydra/``, the job's log) and the lock: what a job that failed before it began,
or a resume that continued in the resumed run's own folder, would otherwise leave for
``collect_runs`` to list.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from aggzoo.errors import RunFolderError, UserError
from aggzoo.training.checkpointing import resolve_ckpt_path, run_dir_of

__all__ = ["LOCK_NAME", "RunFolderLock", "WritableRunFolder", "discard_unused_run_folder", "hold_run_folder",
           "no_room_message", "release_run_folder", "training_run_files", "unwritable_folder_message"]

#: the lock file of a live run, in its folder
LOCK_NAME = ".run.lock"
#: what Hydra writes into every run folder before the job runs (plus the lock): a folder holding
#: only these has no result of its own
_HYDRA_ONLY = {".hydra", LOCK_NAME}

#: what a training run leaves in its folder from its first checkpoint (or its baseline) on
_TRAINING_RUN_FILES = ("checkpoints", "run_summary.json")

#: folders this process holds -> (their lock, how many holders in this process). One lock object per
#: folder: a second flock of the same file from this process would fail against the first.
_HELD: dict[Path, list[Any]] = {}

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


#: the least free space a run starts with: Hydra's record of its config (.hydra/, some 10 KB), its log
#: and its small results; a checkpoint or a descriptor store checks its own size when it is written
RUN_START_BYTES = 1 << 20


def _megabytes(num_bytes: int) -> str:
    return f"{num_bytes / (1 << 20):.1f} MB"


def no_room_message(folder: Path, needed: int = RUN_START_BYTES) -> str | None:
    """Why the file system of ``folder`` (which exists) cannot hold a run's first files, or ``None``."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return None  # not measurable here: writing will tell
    if free >= needed:
        return None
    return (f"no space left for the run folder in {folder}: {_megabytes(free)} free on that file system, a run "
            f"needs at least {_megabytes(needed)} to start (its config record, log and results; checkpoints "
            "more). Free some space, or write the logs to a larger disk with paths.log_dir=<folder>")


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
        parent = Path(str(folder)).parent
        message = unwritable_folder_message(parent)
        if message is not None:
            print(f"error: {message}. Write the logs to a folder you can write with paths.log_dir=<folder>, or "
                  "make this one writable", file=sys.stderr)
            raise SystemExit(_USER_ERROR_STATUS)
        if (message := no_room_message(parent)) is not None:
            # Hydra writes the run's .hydra/ next, before any of aggzoo's code could report a full disk.
            print(f"error: {message}", file=sys.stderr)
            raise SystemExit(_USER_ERROR_STATUS)


#: set by Lightning's process launcher, torchrun and SLURM for every process of a distributed run
_RANK_VARIABLES = ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID")


def _secondary_rank() -> bool:
    """Whether this process is one of a distributed run's processes other than its first."""
    return any(os.environ.get(name, "0") not in ("", "0") for name in _RANK_VARIABLES)


def hold_run_folder(folder: str | os.PathLike) -> Path:
    """Take ``<folder>/.run.lock`` for this process (made if missing; taken again by the same process
    is fine). Returns the resolved folder.

    Raises:
        RunFolderError: a live process holds it.
    """
    folder = Path(folder).resolve()
    if folder in _HELD:
        _HELD[folder][1] += 1
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    if _secondary_rank():
        # A DDP process launched for the run (Lightning re-runs the script per rank, with the same
        # hydra.run.dir): the run's first process holds the folder for all of them.
        return folder
    lock = FileLock(str(folder / LOCK_NAME))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise RunFolderError(
            f"the run folder {folder} is in use by another run that is still running ({folder / LOCK_NAME} is "
            "locked by a live process); wait for it to end, or start this run in a folder of its own (leave "
            "hydra.run.dir unset, or give another one)") from None
    _HELD[folder] = [lock, 1]
    return folder


def training_run_files(folder: str | os.PathLike) -> list[str]:
    """The files of a training run (live or dead) that ``folder`` holds: ``[]`` when it holds none."""
    folder = Path(folder)
    return [name for name in _TRAINING_RUN_FILES if (folder / name).exists()]


def _resumes(config: DictConfig, folder: Path) -> bool:
    """Whether the job of ``config`` (a train job) resumes the run in ``folder``: its ``ckpt_path``
    resolves (as the train job resolves it) to a checkpoint of that folder."""
    if str(OmegaConf.select(config, "task_name", default="")) != "train":
        return False
    try:
        ckpt = resolve_ckpt_path(OmegaConf.select(config, "ckpt_path", default=None),
                                 search_root=Path(str(config.paths.log_dir)) / "train", own_dir=folder)
    except UserError:  # the job itself says what is wrong with ckpt_path
        return False
    found = run_dir_of(ckpt) if ckpt is not None else None
    return found is not None and found.resolve() == folder.resolve()


def release_run_folder(folder: str | os.PathLike) -> None:
    """Undo one :func:`hold_run_folder` of this process (the lock is released with the last)."""
    folder = Path(folder).resolve()
    held = _HELD.get(folder)
    if held is None:
        return
    held[1] -= 1
    if held[1] <= 0:
        del _HELD[folder]
        held[0].release()


def discard_unused_run_folder(folder: str | os.PathLike, *, keep_log_in: Path | None = None) -> bool:
    """Remove ``folder`` when it holds only Hydra's ``.hydra/``, ``*.log`` files and the lock; its logs
    are first moved into ``keep_log_in`` (as ``<name>.<folder name>.log``) when given. Returns whether
    it was removed."""
    folder = Path(folder)
    if not (folder / ".hydra").is_dir():  # only a folder Hydra made for a job
        return False
    entries = list(folder.iterdir())
    if any(e.name not in _HYDRA_ONLY and not (e.is_file() and e.suffix == ".log") for e in entries):
        return False
    if keep_log_in is not None:
        for log_file in (e for e in entries if e.suffix == ".log"):
            # A rename keeps Hydra's open log handler writing into the moved file.
            os.replace(log_file, Path(keep_log_in) / f"{log_file.stem}.{folder.name}.log")
    release_run_folder(folder)
    shutil.rmtree(folder, ignore_errors=True)
    return True


class RunFolderLock(Callback):
    """Hydra callback: hold the run folder (or a sweep's folder) for the run's life, from before Hydra
    writes into it; a folder a live run holds stops this one with one ``error:`` line, exit 2."""

    def __init__(self) -> None:
        self.folder: Path | None = None

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        # The same config object as Hydra's run_job selects from: ${now:...} is cached, same folder.
        self._hold(config, "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._hold(config, "hydra.sweep.dir")

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._release()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._release()

    def _hold(self, config: DictConfig, key: str) -> None:
        folder = OmegaConf.select(config, key, default=None)
        if folder is None:
            return
        try:
            self.folder = hold_run_folder(str(folder))
            if key == "hydra.run.dir" and not _secondary_rank():
                self._keep_a_dead_run(config, self.folder)
        except RunFolderError as error:
            print(f"error: {error}", file=sys.stderr)
            raise SystemExit(_USER_ERROR_STATUS) from None

    def _keep_a_dead_run(self, config: DictConfig, folder: Path) -> None:
        """Refuse a folder holding a training run to every job but the one resuming it; that one
        keeps the run's own ``.hydra/`` (its record of the run's config and overrides)."""
        found = training_run_files(folder)
        if not found:
            return
        if _resumes(config, folder):
            with read_write(config.hydra), open_dict(config.hydra):
                config.hydra.output_subdir = None
            return
        self._release()
        raise RunFolderError(
            f"the run folder {folder} holds a training run ({', '.join(found)}) that this command does not resume; "
            f"starting another job there would overwrite that run's saved config. Resume it with ckpt_path={folder} "
            "(its own config is used), or start this job in a folder of its own (leave hydra.run.dir unset, or give "
            "another one)")

    def _release(self) -> None:
        if self.folder is not None:
            release_run_folder(self.folder)
            self.folder = None
