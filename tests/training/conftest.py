"""One tiny synthetic city generated per test session for the training tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class TinyData:
    root: Path  # the AGGZOO_DATA folder
    gsv: Path  # its GSV-Cities training split (for recipes that point data.train.root at a folder)


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> TinyData:
    """``AGGZOO_DATA`` folder holding the ``synthetic=tiny`` city (generated once, a few seconds)."""
    from hydra.utils import instantiate
    from train_helpers import compose_train

    from aggzoo.data.synthetic import synthetic_city_path

    root = tmp_path_factory.mktemp("aggzoo_data")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AGGZOO_DATA", str(root))
        config = instantiate(compose_train(["synthetic=tiny"], root / "unused").synthetic)
        gsv = Path(synthetic_city_path("gsv", config))
        synthetic_city_path("vg", config)
    return TinyData(root=root, gsv=gsv)
