"""Checkpoint files that are either the old one or the new one, never half of one.

:func:`atomic_save` streams ``torch.save`` into a temporary file *in the target's folder*, flushes
and ``fsync``\\ s it, then ``os.replace``\\ s it over the target and ``fsync``\\ s the folder. A process
killed at any point (or a power cut, thanks to the fsyncs) leaves the previous file untouched; the
orphaned ``.<name>.partial-<pid>-<tag>`` is removed by the next save once its writer is dead.

Compared with Lightning's default writer (serialise to an in-memory buffer, write it through an
fsspec transaction staged in the system temporary folder, move it into place): no second copy of
the checkpoint in RAM, nothing staged on ``/tmp`` (often a small tmpfs: a multi-GB checkpoint fails
there while the output disk has room), and a disk-full error is reported as a
:class:`DiskFullError` that names the file, the free space, the size needed and the fix.

This module needs torch only; the Lightning plugin is
:class:`aggzoo.training.durable_io.DurableCheckpointIO`.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

__all__ = ["DiskFullError", "atomic_save", "tensor_bytes"]

log = logging.getLogger(__name__)

_DISK_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


class DiskFullError(OSError):
    """The disk (or quota) filled up while writing a file; the message says what to do."""


def tensor_bytes(obj: Any) -> int:
    """Bytes of the tensors in a nested checkpoint (a lower bound of its file size)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def _human(num_bytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(num_bytes) < 1024 or unit == "TB":
            return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.1f} {unit}"
        num_bytes /= 1024
    return f"{num_bytes:.1f} TB"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale_partials(target: Path) -> None:
    pattern = re.compile(rf"^\.{re.escape(target.name)}\.partial-(\d+)-[0-9a-f]+$")
    for candidate in target.parent.glob(f".{target.name}.partial-*"):
        match = pattern.match(candidate.name)
        if match and not _alive(int(match.group(1))):
            candidate.unlink(missing_ok=True)
            log.info("removed %s left by an interrupted save", candidate)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # e.g. file systems that do not open folders
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _disk_full(target: Path, obj: Any, err: OSError) -> DiskFullError:
    try:
        free = _human(shutil.disk_usage(target.parent).free)
    except OSError:
        free = "unknown"
    previous = (f"The previous {target.name} is intact. " if target.exists() else "")
    return DiskFullError(
        errno.ENOSPC,
        f"disk full while writing {target} ({os.strerror(err.errno or errno.ENOSPC)}; {free} free on that file "
        f"system, the file needs at least {_human(tensor_bytes(obj))}). {previous}Free some space or write to a "
        "larger disk (paths.output_dir=..., or callbacks.model_checkpoint.dirpath=...), then resume with "
        "ckpt_path=<the last checkpoint>.",
    )


def atomic_save(obj: Any, path: str | os.PathLike, *, save: Callable[[Any, Any], None] = torch.save) -> None:
    """``save(obj, file)`` to ``path`` atomically and durably (see the module docstring).

    Raises:
        DiskFullError: no space (or quota) left; the partial file is removed, ``path`` is untouched.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_partials(target)
    tmp = target.with_name(f".{target.name}.partial-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        # os.open with 0o666 lets the umask decide the mode, as for any other file the run writes.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as handle:
            save(obj, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError) and err.errno in _DISK_FULL:
            raise _disk_full(target, obj, err) from err
        raise
    _fsync_dir(target.parent)
