"""Start-up lines of other libraries that alarm a newcomer and say nothing about their run, silenced
one by one (by logger and message, or by the warning's module and text), never all warnings at once.

- ``faiss.loader`` logs at INFO which CPU-specific build it tries first; the failed attempt reads
  ``Could not load library with AVX512 support due to: ModuleNotFoundError(...)`` although faiss then
  loads its generic build, which is what ``pip install faiss-cpu`` ships. Its warnings still show.
- Lightning's ``rank_zero`` logger advertises its cloud products (``💡 Tip: ... litlogger`` / ``litmodels``).
- Lightning's own code calls APIs that torch has deprecated (``_pytree``'s ``LeafSpec``): the warning is
  addressed to Lightning's developers; a deprecation in aggzoo's own code, or in a user's, still shows.
"""

from __future__ import annotations

import logging
import warnings

__all__ = ["ADVERT_PREFIX", "quiet_startup_noise"]

#: how Lightning's advertisements start
ADVERT_PREFIX = "💡 Tip:"
#: (message regex, module regex) of deprecation warnings raised by Lightning's own code, not the caller's
_LIGHTNING_DEPRECATIONS = (
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", r"lightning\.pytorch\.utilities\._pytree"),
)


class _DropAdverts(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(ADVERT_PREFIX)


def quiet_startup_noise() -> None:
    """Install the filters above (idempotent); call it before faiss and Lightning are imported."""
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, _DropAdverts) for f in rank_zero.filters):
        rank_zero.addFilter(_DropAdverts())
    for message, module in _LIGHTNING_DEPRECATIONS:
        for category in (DeprecationWarning, FutureWarning):  # torch's @deprecated uses FutureWarning
            warnings.filterwarnings("ignore", message=message, category=category, module=module)
