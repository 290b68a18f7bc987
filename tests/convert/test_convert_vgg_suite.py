"""Released checkpoints of three methods of gmberton/VPR-methods-evaluation: NetVLAD VGG16 (the suite's
module, parsed from the authors' MATLAB network), SFRS (yxgeee/OpenIBL) and AP-GeM (naver/deep-image-retrieval).

Each layout was dumped from the authors' own module (tests/convert/layouts/*.json); every tensor gets distinct
values and must land where it belongs, transformed where the layouts differ (1x1 conv -> Linear, D x K centres
-> K x D, the suite's channel-major whitening columns -> K-major, the PCA -> P and -P m).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from official_layouts import assert_placed, authors_layout, fill, save

import aggzoo

_CHANNELS, _CLUSTERS = 512, 64


def _vgg_target(key: str, prefix: str) -> str:
    return "backbone.model.features." + key[len(prefix):]


def test_sfrs_openibl_release(tmp_path: Path) -> None:
    upstream = fill(authors_layout("vgg16_netvlad"))
    path = save(upstream, tmp_path / "vgg16_netvlad.pth")  # hubconf: a raw state dict, loaded strictly
    model = aggzoo.create_model("sfrs_vgg16.official", checkpoint_path=path)
    mapping = {}
    for key in upstream:
        if key.startswith("base_model.base."):
            mapping[key] = _vgg_target(key, "base_model.base.")
        else:
            mapping[key] = {"net_vlad.conv.weight": "head.conv.weight", "net_vlad.centroids": "head.centroids",
                            "pca_layer.weight": "head.whiten.weight", "pca_layer.bias": "head.whiten.bias"}[key]
    # The 1x1 conv [4096, 32768, 1, 1] becomes the Linear weight [4096, 32768]: the same numbers.
    transformed = {"head.whiten.weight": upstream["pca_layer.weight"][:, :, 0, 0]}
    assert_placed(model, upstream, mapping, transformed)
    assert model.out_dim == 4096


def test_netvlad_vgg16_suite_module(tmp_path: Path) -> None:
    upstream = fill(authors_layout("VGG16-NetVLAD-Pitts30K"))
    path = save(upstream, tmp_path / "netvlad_suite.pth")
    model = aggzoo.create_model("netvlad_vgg16.pitts30k", checkpoint_path=path)
    mapping = {key: _vgg_target(key, "backbone.") for key in upstream if key.startswith("backbone.")}
    mapping |= {"netvlad.score_proj.weight": "head.conv.weight", "netvlad.centers": "head.centroids",
                "whiten.weight": "head.whiten.weight", "whiten.bias": "head.whiten.bias"}
    # The suite's vector entry c * K + k is our entry k * C + c: gather the columns by that index.
    ours = torch.arange(_CHANNELS * _CLUSTERS)
    suite_column = (ours % _CHANNELS) * _CLUSTERS + ours // _CHANNELS
    transformed = {
        "head.conv.weight": upstream["netvlad.score_proj.weight"][..., None],
        "head.centroids": upstream["netvlad.centers"].T,
        "head.whiten.weight": upstream["whiten.weight"][:, suite_column],
    }
    assert_placed(model, upstream, mapping, transformed)
    assert model.out_dim == 4096


def _matconvnet_file(suite: dict[str, torch.Tensor], path: Path) -> Path:
    """The suite's module weights written back as the MatConvNet structure its loader parses
    (vpr_models/netvlad.py): ``net.layers{i}.weights = {w [S, S, IN, OUT], b}`` at the positions of
    ``vgg16().features``, layer 30 ``{score [D, K], -centres [D, K]}``, ``net.meta.normalization.averageImage``."""
    from scipy.io import savemat

    layers = np.empty(31, dtype=object)
    for i in range(31):
        layers[i] = {"name": f"layer{i}", "type": "relu", "weights": np.empty((0,), dtype=object)}
    for key, value in suite.items():
        if key.startswith("backbone.") and key.endswith(".weight"):
            index = int(key.split(".")[1])
            cell = np.empty(2, dtype=object)
            cell[0] = value.permute(2, 3, 1, 0).numpy()
            cell[1] = suite[f"backbone.{index}.bias"].numpy()
            layers[index] = {"name": f"conv{index}", "type": "conv", "weights": cell}
    vlad = np.empty(2, dtype=object)
    vlad[0] = suite["netvlad.score_proj.weight"][:, :, 0].T.numpy()
    vlad[1] = -suite["netvlad.centers"].numpy()
    layers[30] = {"name": "vlad:core", "type": "custom", "weights": vlad}
    meta = {"normalization": {"averageImage": np.array([[[123.68, 116.779, 103.939]]], dtype=np.float32)}}
    savemat(str(path), {"net": {"layers": layers, "meta": meta}})
    return path


def test_netvlad_vgg16_matconvnet_file(tmp_path: Path) -> None:
    """The released .mat itself (read as data), here without its 4096-D whitening (512 MB): the 32768-D model."""
    suite = {k: v for k, v in fill(authors_layout("VGG16-NetVLAD-Pitts30K")).items() if not k.startswith("whiten.")}
    path = _matconvnet_file(suite, tmp_path / "Pitts30K_struct.mat")
    model = aggzoo.create_model("netvlad_vgg16.pitts30k_32768", checkpoint_path=path)
    mapping = {key: _vgg_target(key, "backbone.") for key in suite if key.startswith("backbone.")}
    mapping |= {"netvlad.score_proj.weight": "head.conv.weight", "netvlad.centers": "head.centroids"}
    transformed = {"head.conv.weight": suite["netvlad.score_proj.weight"][..., None],
                   "head.centroids": suite["netvlad.centers"].T}
    assert_placed(model, suite, mapping, transformed)
    assert model.out_dim == _CHANNELS * _CLUSTERS


def test_netvlad_vgg16_32768_drops_the_whitening() -> None:
    """``--descriptors_dimension 32768``: the same file, no whitening (checked on the meta device)."""
    from aggzoo.zoo.netvlad import convert_netvlad_vgg16_suite

    layout = authors_layout("VGG16-NetVLAD-Pitts30K")
    with torch.device("meta"):
        model = aggzoo.create_model("netvlad_vgg16", whiten_dim=None)
        converted = convert_netvlad_vgg16_suite({k: torch.empty(shape) for k, shape in layout}, model)
    assert {k: tuple(v.shape) for k, v in converted.items()} == {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert model.out_dim == _CHANNELS * _CLUSTERS


def _dirtorch_checkpoint(upstream: dict[str, torch.Tensor]) -> dict[str, object]:
    """The released file's shape (dirtorch load_model): weights under "state_dict" (DataParallel "module."
    names) and the whitening as a fitted scikit-learn PCA object under "pca"."""
    from sklearn.decomposition import PCA

    pca = "pca.Landmarks_clean."
    whitening = PCA(whiten=bool(upstream[pca + "whiten"]))
    for field in ("mean_", "components_", "explained_variance_"):
        setattr(whitening, field, upstream[pca + field].double().numpy())
    weights = {f"module.{k}": v for k, v in upstream.items() if not k.startswith(pca)}
    return {"model_options": {"arch": "resnet101_rmac", "out_dim": 2048, "pooling": "gem", "gemp": 3},
            "state_dict": weights, "preprocess": {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]},
            "pca": {"Landmarks_clean": whitening}}


def test_apgem_dirtorch_release(tmp_path: Path) -> None:
    upstream = fill(authors_layout("Resnet-101-AP-GeM"))
    path = save(_dirtorch_checkpoint(upstream), tmp_path / "Resnet-101-AP-GeM.pt")
    model = aggzoo.create_model("apgem_resnet101.official", checkpoint_path=path)
    pca = "pca.Landmarks_clean."
    mapping: dict[str, str | None] = {}
    for key in upstream:
        if key.startswith(("conv1.", "bn1.", "layer")):
            mapping[key] = "backbone.model." + key
        elif key.startswith(pca):
            mapping[key] = {"components_": "head.whiten.weight", "mean_": "head.whiten.bias"}.get(key[len(pca):])
        else:
            mapping[key] = {"adpool.p": "head.gem.pool.p", "fc.weight": "head.fc.weight", "fc.bias": "head.fc.bias"}[key]
    # dirtorch whiten_features: (x - mean_) @ components_.T / explained_variance_ ** 0.25 (whitenp, whitenm = 1)
    components = upstream[pca + "components_"].double()
    scale = upstream[pca + "explained_variance_"].double() ** 0.25
    weight = components / scale[:, None]
    transformed = {"head.whiten.weight": weight.float(),
                   "head.whiten.bias": (-(weight @ upstream[pca + "mean_"].double())).float()}
    assert_placed(model, upstream, mapping, transformed)
    assert model.out_dim == 2048


def test_apgem_without_the_pca_names_it(tmp_path: Path) -> None:
    from aggzoo.errors import StateDictMismatchError

    upstream = {k: v for k, v in fill(authors_layout("Resnet-101-AP-GeM")).items() if not k.startswith("pca.")}
    path = save({"state_dict": upstream}, tmp_path / "no_pca.pth")
    with pytest.raises(StateDictMismatchError, match="pca.Landmarks_clean.mean_"):
        aggzoo.create_model("apgem_resnet101.official", checkpoint_path=path)
    unwhitened = aggzoo.create_model("apgem_resnet101.official", checkpoint_path=path, whiten=False)
    assert unwhitened.head.whiten is None
