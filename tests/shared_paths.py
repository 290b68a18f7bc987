"""Where the tests find the team's shared data: the rule of the pipeline's ``paths.shared_data``
(conf/paths/default.yaml), so a clone that is not beside the team's checkout runs the real-data
tests too once ``AGGZOO_SHARED_DATA`` names the folder.

``AGGZOO_SHARED_DATA`` when set (and not empty), else ``<checkout>/../shared/data``. The folder holds
``nordland_mini/``; ``REFERENCE.md`` sits one level up, beside it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
ENV = "AGGZOO_SHARED_DATA"


def shared_data_dir(environ: Mapping[str, str] | None = None, repo_root: Path = REPO_ROOT) -> Path:
    """The shared data folder (see the module docstring)."""
    value = (os.environ if environ is None else environ).get(ENV, "")
    if value.strip():
        return Path(value).expanduser().resolve()
    return repo_root.parent / "shared" / "data"


SHARED_DATA = shared_data_dir()
NORDLAND_MINI = SHARED_DATA / "nordland_mini"
REFERENCE = SHARED_DATA.parent / "REFERENCE.md"
