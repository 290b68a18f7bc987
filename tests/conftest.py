"""Shared fixtures: paths, seeds and tiny backbones."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from shared_paths import ENV, NORDLAND_MINI

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def nordland_mini() -> Path:
    if not (NORDLAND_MINI / "vg").is_dir():
        pytest.skip(f"real test data not found at {NORDLAND_MINI} (beside the team's checkout, or set {ENV})")
    return NORDLAND_MINI
