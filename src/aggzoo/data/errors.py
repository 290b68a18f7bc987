"""Errors a user causes by pointing a loader at the wrong place or at malformed files.

Every message says what was expected (the on-disk layout) and how to fix it (where the data is
published, which argument to change).
"""

from __future__ import annotations

__all__ = ["DatasetLayoutError", "DatasetFormatError"]


class DatasetLayoutError(FileNotFoundError):
    """A dataset folder or file is missing: the message names the expected layout and the source."""


class DatasetFormatError(ValueError):
    """A dataset file exists but its content or name is malformed: the message names the file."""
