"""Every error aggzoo raises on purpose, in one place.

:class:`UserError` is the base of every error a user can cause (a wrong path, a bad config value, a
corrupt file, a model name that does not exist, a full disk). Its message says what was expected
and how to fix it, so the entry points (``train.py``, ``eval.py``, the ``aggzoo.cli`` commands)
catch this one base, print ``error: <message>`` and exit with status 2. Anything else that escapes
is a bug and keeps its traceback.

Each error also derives from the built-in type callers would catch without knowing aggzoo
(``FileNotFoundError`` for a missing dataset, ``ValueError`` for a bad value, ``OSError`` for an
unreadable image), so ``except ValueError`` keeps working.

This module imports nothing of aggzoo: every layer may raise these.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "AggzooError",
    "CheckpointError",
    "CheckpointMismatchError",
    "CheckpointNotFoundError",
    "ChecksumMismatchError",
    "ConfigError",
    "ConversionError",
    "DatasetFormatError",
    "DatasetLayoutError",
    "UnsafeDataFileError",
    "DiskFullError",
    "ExportError",
    "ImageReadError",
    "ManifestError",
    "MissingExtraError",
    "NonFiniteError",
    "PublishError",
    "RunFolderError",
    "PreflightError",
    "StateDictMismatchError",
    "UnknownModelError",
    "UnsafeCheckpointError",
    "UnsafeSpecError",
    "UserError",
    "WeightsUnavailableError",
    "user_message",
]


class AggzooError(Exception):
    """Base of every error aggzoo raises on purpose."""


class UserError(AggzooError):
    """Something the user can fix; the message says what was expected and how.

    Entry points print it as one ``error: ...`` line and exit with status 2.
    """


# -- configuration and preflight -------------------------------------------------------------------


class ConfigError(UserError, ValueError):
    """A config key holds a value of the wrong type or out of range; the message names the key."""


class PreflightError(UserError, ValueError):
    """The configuration or the data cannot work; the message lists every problem and its fix."""


# -- data ------------------------------------------------------------------------------------------


class DatasetLayoutError(UserError, FileNotFoundError):
    """A dataset folder or file is missing: the message names the expected layout and the source."""


class DatasetFormatError(UserError, ValueError):
    """A dataset file exists but its content or name is malformed: the message names the file."""


class UnsafeDataFileError(DatasetFormatError):
    """A data file (a pickled ground truth) names a Python global that is not a numpy array type, so
    loading it could run code: it was refused before anything in it ran; the message names the file
    and the global."""


class ImageReadError(UserError, OSError):
    """An image file could not be read; the message names the file and the reason.

    ``path`` and ``reason`` (the message without the file name) are kept for lists of skipped files.
    """

    def __init__(self, message: str, path: str | Path | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.path = None if path is None else str(path)
        self.reason = message if reason is None else reason


# -- models, weights and checkpoints ---------------------------------------------------------------


class UnknownModelError(UserError, ValueError):
    """No registered architecture or tag has this name; the message lists the closest ones."""


class UnsafeSpecError(UserError, ValueError):
    """A model spec (from a checkpoint, a config.json or a config) names something that is not an
    aggzoo model class; it was refused before anything was imported or called."""


class CheckpointError(UserError, RuntimeError):
    """A weights or checkpoint file cannot be used (corrupt, truncated, not a checkpoint)."""


class ChecksumMismatchError(CheckpointError):
    """The file's sha256 differs from the pinned one: refused before parsing."""


class UnsafeCheckpointError(CheckpointError):
    """The file would need to run code to load (a pickle naming non-tensor globals)."""


class StateDictMismatchError(CheckpointError):
    """Keys or shapes of a checkpoint do not match the model."""


class CheckpointMismatchError(CheckpointError, ValueError):
    """A training checkpoint given to resume does not fit the configured model."""


class CheckpointNotFoundError(UserError, FileNotFoundError):
    """``ckpt_path`` names nothing to resume; the message says where it looked."""


class ConversionError(UserError, ValueError):
    """A checkpoint does not have the layout its key-remapping rules expect."""


class WeightsUnavailableError(UserError, FileNotFoundError):
    """The weights are neither shipped, cached, nor downloadable from here; the message says where
    to place the file."""


class ManifestError(UserError, ValueError):
    """``weights/manifest.json`` is malformed."""


class PublishError(UserError, RuntimeError):
    """The Hugging Face Hub refused an upload (``push_to_hub``): no or wrong token, no write access, a bad name."""


class ExportError(UserError, RuntimeError):
    """The model could not be exported to the requested format, or the export disagrees with it."""


class MissingExtraError(UserError, ImportError):
    """A command needs an optional dependency that is not installed; the message names the extra."""


# -- training --------------------------------------------------------------------------------------


class DiskFullError(UserError, OSError):
    """The disk (or quota) filled up while writing a file; the message says what to do."""


class RunFolderError(UserError, PermissionError):
    """The run folder a job writes to (a resumed run's own folder) cannot be written; the message says
    where to write instead."""


class NonFiniteError(UserError, FloatingPointError):
    """Training produced a non-finite loss or weights; the message names the step and the fix."""


def user_message(err: BaseException) -> str:
    """The one line a user sees for ``err`` (what ``error: ...`` prints, what a sweep records)."""
    text = str(err)
    if isinstance(err, UserError) and isinstance(err, OSError) and err.strerror and len(err.args) == 2:
        text = str(err.strerror)  # DiskFullError(errno, message): the message, without "[Errno 28] "
    # An error raised in a DataLoader worker comes back as "Caught X in DataLoader worker process N.
    # Original Traceback ...": the last line is the original message.
    if "Original Traceback" in text:
        last = [line for line in text.splitlines() if line.strip()][-1]
        text = last.split(": ", 1)[1] if ": " in last else last
    return text
