"""Checkpoint formats read as data: fitted scikit-learn PCA whitenings inside torch files (naver/deep-image-retrieval;
the fields are kept, scikit-learn is never called, any other estimator is still refused) and MATLAB .mat files
(MatConvNet networks: every numeric array named by its path in the structure)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.decomposition import PCA
from sklearn.preprocessing import StandardScaler

from aggzoo.errors import CheckpointError, UnsafeCheckpointError
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


def test_matlab_structures_become_named_tensors(tmp_path: Path) -> None:
    from scipy.io import savemat

    cell = np.empty(2, dtype=object)
    cell[0], cell[1] = np.arange(6, dtype=np.float32).reshape(2, 3), np.array([7.0, 8.0], dtype=np.float32)
    layers = np.empty(2, dtype=object)
    layers[0] = {"name": "relu1", "weights": np.empty((0,), dtype=object)}
    layers[1] = {"name": "conv2", "weights": cell, "stride": np.array([1.0, 1.0])}
    path = tmp_path / "net.mat"
    savemat(str(path), {"net": {"layers": layers, "meta": {"size": 3.0}}})
    state = read_checkpoint(path).state_dict()
    assert set(state) == {"net.layers.1.weights.0", "net.layers.1.weights.1", "net.layers.1.stride", "net.meta.size"}
    assert torch.equal(state["net.layers.1.weights.0"], torch.arange(6.0).reshape(2, 3))
    assert float(state["net.meta.size"]) == 3.0


def test_a_damaged_matlab_file_is_one_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.mat"
    path.write_bytes(b"MATLAB 5.0 MAT-file, truncated" + bytes(40))
    with pytest.raises(CheckpointError, match="not a readable MATLAB file"):
        read_checkpoint(path)
