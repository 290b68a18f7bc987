"""The tests find the team's shared data where the pipeline does (issue 14 item 11): AGGZOO_SHARED_DATA
when set, else ../shared/data beside the checkout, the rule of conf/paths/default.yaml."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from shared_paths import ENV, REPO_ROOT, shared_data_dir


def test_env_wins_and_default_is_beside_the_checkout(tmp_path: Path) -> None:
    assert shared_data_dir({ENV: str(tmp_path / "team")}, repo_root=tmp_path / "clone") == tmp_path / "team"
    assert shared_data_dir({}, repo_root=tmp_path / "clone") == tmp_path / "shared" / "data"
    assert shared_data_dir({ENV: ""}, repo_root=tmp_path / "clone") == tmp_path / "shared" / "data"


@pytest.mark.parametrize("set_env", [True, False])
def test_same_rule_as_paths_shared_data(monkeypatch, tmp_path: Path, set_env: bool) -> None:
    paths = OmegaConf.create({"paths": OmegaConf.load(REPO_ROOT / "conf" / "paths" / "default.yaml")}).paths
    monkeypatch.setenv("AGGZOO_ROOT", str(REPO_ROOT))
    if set_env:
        monkeypatch.setenv(ENV, str(tmp_path / "team"))
    else:
        monkeypatch.delenv(ENV, raising=False)
    assert Path(paths.shared_data).resolve() == shared_data_dir(os.environ).resolve()


def test_nordland_fixture_and_shipped_weights_follow_the_env(tmp_path: Path) -> None:
    """A fresh interpreter (the paths are read at import) with AGGZOO_SHARED_DATA set: the fixture's
    folder, REFERENCE.md and the shipped-weights test all point under it."""
    team = tmp_path / "elsewhere" / "data"
    code = ("import sys; sys.path[:0] = ['tests', 'tests/hub', 'tests/training'];"
            "import shared_paths as s; print(s.NORDLAND_MINI); print(s.REFERENCE)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env={**os.environ, ENV: str(team)},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == [str(team / "nordland_mini"), str(team.parent / "REFERENCE.md")]
