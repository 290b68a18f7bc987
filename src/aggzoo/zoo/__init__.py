"""The model zoo: one file per method, each holding the key-remapping rules of its official
checkpoints, its ``pretrained_cfgs`` table and its ``@register_model`` entry points, in that order.

The method files are found in this folder (a new file is part of the zoo the moment it exists);
:func:`import_method_files` imports them, which fills the registry tables. Only
:mod:`aggzoo.hub.factory` calls it, so ``import aggzoo`` stays light until a model is asked for.
The layer sits above :mod:`aggzoo.hub` (whose tables it fills) and :mod:`aggzoo.models`.
"""

from __future__ import annotations

import importlib
import pkgutil

__all__ = ["import_method_files"]


def import_method_files() -> list[str]:
    """Import every method file of the zoo (``_``-prefixed helpers excluded); returns their names."""
    names = [m.name for m in pkgutil.iter_modules(__path__, __name__ + ".") if not m.name.rpartition(".")[2].startswith("_")]
    for name in names:
        importlib.import_module(name)
    return names
