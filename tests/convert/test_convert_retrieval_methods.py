"""CVNet's released ``CVNet_Rerank`` checkpoints (R50, R101) and cirtorch's ResNet-101 ``-gem-w`` networks: a file with the layout dumped from the authors' module
(``layouts/cvnet_r{50,101}.json``) loads into ``cvnet_resnet*.official``, every global-network tensor where it
belongs (pycls names -> timm's, the stem's input channels flipped BGR -> RGB), the re-ranking network dropped.

The expected target of each key is written here from pycls' naming scheme (not by calling the converter)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from official_layouts import assert_placed, authors_layout, fill, save

import aggzoo
from aggzoo.errors import StateDictMismatchError

_PARTS = {"f.a": "conv1", "f.a_bn": "bn1", "f.b": "conv2", "f.b_bn": "bn2", "f.c": "conv3", "f.c_bn": "bn3",
          "proj": "downsample.0", "bn": "downsample.1"}


def _target(key: str) -> str | None:
    """Where an upstream key belongs: ``None`` for CVNet-Rerank's correlation network."""
    if key.startswith(("conv2ds.", "cv_learner.")):
        return None
    rest = key.removeprefix("encoder_q.")
    if rest.startswith("head."):
        return rest
    if rest.startswith("stem."):
        return "backbone.model." + rest.replace("stem.conv.", "conv1.").replace("stem.bn.", "bn1.")
    stage, block, part, leaf = re.fullmatch(r"s(\d)\.b(\d+)\.(f\.\w+|proj|bn)\.(\w+)", rest).groups()
    return f"backbone.model.layer{stage}.{int(block) - 1}.{_PARTS[part]}.{leaf}"


@pytest.mark.parametrize("depth", [50, 101])
def test_cvnet_official_places_every_global_tensor(tmp_path: Path, depth: int) -> None:
    upstream = fill(authors_layout(f"cvnet_r{depth}"))
    path = save({"model_state": upstream, "epoch": 1}, tmp_path / f"CVPR2022_CVNet_R{depth}.pyth")
    model = aggzoo.create_model(f"cvnet_resnet{depth}.official", checkpoint_path=path)
    mapping = {key: _target(key) for key in upstream}
    stem = upstream["encoder_q.stem.conv.weight"]
    assert_placed(model, upstream, mapping, transformed={"backbone.model.conv1.weight": stem[:, [2, 1, 0]]})
    dropped = [key for key, target in mapping.items() if target is None]
    assert len(dropped) > 10 and model.out_dim == 2048  # the re-ranking network is there, and left out


def test_a_file_of_another_network_is_refused(tmp_path: Path) -> None:
    upstream = fill(authors_layout("cvnet_r50"))
    upstream["encoder_q.s5.b1.f.a.weight"] = torch.zeros(1)  # no such stage in CVNet's ResNet
    path = save({"model_state": upstream}, tmp_path / "other.pyth")
    with pytest.raises(StateDictMismatchError, match="match no conversion rule.*s5"):
        aggzoo.create_model("cvnet_resnet50.official", checkpoint_path=path)


def test_the_cfgs_state_the_authors_protocol() -> None:
    for depth in (50, 101):
        cfg = aggzoo.list_pretrained(f"cvnet_resnet{depth}.official", with_cfg=True)[0]
        assert cfg.out_dim == 2048 and cfg.remap_name == "aggzoo.zoo.cvnet.convert_cvnet"
        assert cfg.filename == f"CVPR2022_CVNet_R{depth}.pyth"


# -- cnnimageretrieval-pytorch's ResNet-101 GeM + whitening networks -----------------------------------------------

_CHILD = {"0": "conv1", "1": "bn1", "4": "layer1", "5": "layer2", "6": "layer3", "7": "layer4"}


@pytest.mark.parametrize("tag", ["gl18_tl", "rsfm120k_tl"])
def test_cirtorch_gem_w_places_every_tensor(tmp_path: Path, tag: str) -> None:
    upstream = fill(authors_layout("cirtorch_resnet101_gem_w"))
    path = save({"state_dict": upstream, "epoch": 1}, tmp_path / "gl18-tl-resnet101-gem-w.pth")
    model = aggzoo.create_model(f"gem_fc_resnet101.{tag}", checkpoint_path=path)

    def target(key: str) -> str:
        if key == "pool.p":
            return "head.pool.p"
        if key.startswith("whiten."):
            return key.replace("whiten.", "head.fc.")
        index, _, rest = key.removeprefix("features.").partition(".")
        return f"backbone.model.{_CHILD[index]}.{rest}"

    assert_placed(model, upstream, {key: target(key) for key in upstream})
    cfg = model.pretrained_cfg
    assert cfg.metrics["roxford5k/medium/mAP"] > cfg.metrics["roxford5k/hard/mAP"]  # the README's M and H columns
