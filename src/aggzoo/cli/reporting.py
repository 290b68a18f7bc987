"""How every entry point reports what the user got wrong: one ``error:`` line and exit status 2.

Every error a user can cause derives from :class:`~aggzoo.errors.UserError`, whose message already
says what was expected and how to fix it; :func:`reported_user_errors` catches that one base (and a
full disk or a file this user may not write or read, wherever it happens). Anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from aggzoo.errors import UserError, user_message

__all__ = ["disk_full_message", "exit_with_user_error", "is_disk_full", "reported_user_errors", "user_message"]

log = logging.getLogger(__name__)

#: Exit status of a run stopped by a user error (as argparse and Hydra use for bad usage).
USER_ERROR_STATUS = 2
_DISK_FULL = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
_NOT_PERMITTED = (errno.EACCES, errno.EPERM, errno.EROFS)


@contextmanager
def reported_user_errors() -> Iterator[None]:
    """Print a :class:`~aggzoo.errors.UserError` as ``error: <message>`` on stderr and exit with
    status 2. Other exceptions (bugs) propagate with their stack trace. Usage in an entry point::

        with reported_user_errors():
            train(cfg)
    """
    try:
        yield
    except UserError as err:
        exit_with_user_error(user_message(err))
    except OSError as err:
        if err.errno in _DISK_FULL:
            # A full disk outside the checkpoint writer (logs, results, the bad-image list).
            exit_with_user_error(disk_full_message(err))
        if err.errno in _NOT_PERMITTED and err.filename:
            # A read-only run folder (a resumed run's, a shared one) or an unreadable data file.
            exit_with_user_error(
                f"permission denied: {err.filename} ({err.strerror}). Make it writable (readable, for data) by "
                "this user, or point the job elsewhere: paths.log_dir=<folder> for what a run writes, "
                "paths.data_root=<folder> for the datasets.")
        raise


def is_disk_full(err: BaseException) -> bool:
    """Whether ``err`` is a write refused for want of space (or quota)."""
    return isinstance(err, OSError) and err.errno in _DISK_FULL


def disk_full_message(err: OSError) -> str:
    """The one line of a full disk met while writing ``err.filename``: where, how much is free, the fix."""
    where = err.filename or "the run folder"
    free = ""
    if err.filename:
        try:
            free = f"; {shutil.disk_usage(os.path.dirname(os.path.abspath(err.filename))).free} bytes free there"
        except OSError:
            free = ""
    return (f"disk full while writing {where} ({err.strerror}{free}). Free some space or write to a larger disk "
            "(paths.output_dir=...); a training run resumes with ckpt_path=last.")


def _to_log_files(message: str) -> None:
    """``message`` as an ERROR record into the log files this module's logger reaches (the run's
    ``<task>.log``), not to its console handlers: the ``error:`` line is what the console shows, once."""
    record = log.makeRecord(log.name, logging.ERROR, __file__, 0, "%s", (message,), None)
    logger: logging.Logger | None = log
    while logger is not None:
        for handler in logger.handlers:
            if isinstance(handler, logging.FileHandler) and record.levelno >= handler.level:
                handler.handle(record)
        logger = logger.parent if logger.propagate else None


def exit_with_user_error(message: str, *, to_log: bool = True) -> None:
    """Print ``error: <message>`` on stderr (and, with ``to_log``, to the run's log file when there is one),
    exit with status 2."""
    if to_log:
        _to_log_files(message)
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(USER_ERROR_STATUS) from None
