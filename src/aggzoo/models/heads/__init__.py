"""Aggregation heads, one method per file; each consumes ``Features`` and returns ``[B, D]``."""

from aggzoo.models.heads.base import Head

__all__ = ["Head"]
