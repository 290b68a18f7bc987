"""One tiny synthetic city generated per test session for the training tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``AGGZOO_DATA`` folder holding the ``synthetic=tiny`` city (generated once, a few seconds)."""
    from hydra.utils import instantiate

    from aggzoo.data.synthetic import synthetic_city_path

    from train_helpers import compose_train

    root = tmp_path_factory.mktemp("aggzoo_data")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AGGZOO_DATA", str(root))
        cfg = compose_train(["synthetic=tiny"], root / "unused")
        config = instantiate(cfg.synthetic)
        synthetic_city_path("gsv", config)
        synthetic_city_path("vg", config)
    return root
