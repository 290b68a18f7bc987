"""Checkpoints that carry fitted scikit-learn PCA whitenings (naver/deep-image-retrieval): the fields are read
as data, scikit-learn is never called, and any other estimator or code is still refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.decomposition import PCA
from sklearn.preprocessing import StandardScaler

from aggzoo.errors import UnsafeCheckpointError
from aggzoo.hub.checkpoint import PickledEstimator, read_checkpoint


def _fitted_pca() -> PCA:
    rng = np.random.default_rng(0)
    return PCA(n_components=3, whiten=True).fit(rng.standard_normal((40, 5)))


def test_pca_fields_become_tensors(tmp_path: Path) -> None:
    pca = _fitted_pca()
    path = tmp_path / "dirtorch.pt"
    torch.save({"state_dict": {"module.fc.weight": torch.ones(2, 2)}, "pca": {"Landmarks_clean": pca},
                "model_options": {"arch": "resnet101_rmac"}}, path)
    read = read_checkpoint(path)
    assert isinstance(read.contents["pca"]["Landmarks_clean"], PickledEstimator)
    state = read.state_dict()
    assert set(state) == {"fc.weight"} | {f"pca.Landmarks_clean.{f}" for f in
                                          ("mean_", "components_", "explained_variance_", "whiten")}
    assert np.array_equal(state["pca.Landmarks_clean.components_"].numpy(), pca.components_)
    assert np.array_equal(state["pca.Landmarks_clean.mean_"].numpy(), pca.mean_)
    assert bool(state["pca.Landmarks_clean.whiten"]) is True


def test_reading_does_not_import_scikit_learn(tmp_path: Path) -> None:
    path = tmp_path / "dirtorch.pt"
    torch.save({"state_dict": {"fc.weight": torch.ones(1)}, "pca": {"x": _fitted_pca()}}, path)
    script = ("import sys; from aggzoo.hub.checkpoint import read_checkpoint; "
              f"s = read_checkpoint({str(path)!r}).state_dict(); "
              "assert 'pca.x.components_' in s; print('sklearn' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_other_estimators_are_still_refused(tmp_path: Path) -> None:
    path = tmp_path / "scaler.pt"
    torch.save({"state_dict": {"w": torch.ones(1)}, "scaler": StandardScaler().fit(np.ones((3, 2)))}, path)
    with pytest.raises(UnsafeCheckpointError, match="StandardScaler"):
        read_checkpoint(path)
