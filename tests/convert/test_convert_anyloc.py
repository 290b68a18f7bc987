"""AnyLoc's released vocabularies (``c_centers.pt``, one bare tensor) -> ``anyloc_dinov2_vitg14.<domain>``.

The layout ``layouts/anyloc_dinov2_vitg14_l31_value_c32.json`` was dumped from the authors' own code path
(AnyLoc/DINO ``VLAD(32).fit`` then ``torch.save(c_centers)``, as the hub's release files are written).
The ViT-G/14 backbone is replaced by a two-block ViT of the same width (1536): the file holds no backbone.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import official_layouts as ol
import pytest
import torch

import aggzoo
from aggzoo.cli.main import main
from aggzoo.errors import StateDictMismatchError
from aggzoo.hub.checkpoint import BARE_TENSOR_KEY
from aggzoo.hub.factory import get_pretrained_cfg
from aggzoo.hub.loading import load_checkpoint, load_pretrained
from aggzoo.zoo.anyloc import ANYLOC_DOMAINS

#: a ViT as wide as ViT-G/14 (1536) but two blocks deep, so the released [32, 1536] vocabulary fits
NARROW_G = {"model_name": "test_vit", "embed_dim": 1536, "depth": 2, "num_heads": 2, "block": 1, "frozen_stages": 0,
            "img_size": 56, "patch_size": 14}


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return aggzoo.create_model("anyloc_dinov2_vitg14", backbone_kwargs=NARROW_G)


def test_every_domain_is_registered_with_the_hubs_url() -> None:
    names = aggzoo.list_pretrained("anyloc_dinov2_vitg14.*")
    assert sorted(names) == sorted(f"anyloc_dinov2_vitg14.{d}" for d in ANYLOC_DOMAINS)
    for domain in ANYLOC_DOMAINS:
        cfg = get_pretrained_cfg(f"anyloc_dinov2_vitg14.{domain}")
        assert cfg.url == f"https://github.com/AnyLoc/DINO/releases/download/v1/dinov2_vitg14_l31_value_c32_{domain}_c_centers.pt"
        assert cfg.contents == "delta" and cfg.out_dim == 32 * 1536
    assert get_pretrained_cfg("anyloc_dinov2_vitg14").tag == "indoor"  # the hub's default domain


@pytest.mark.parametrize("domain", ["urban", "aerial"])
def test_released_vocabulary_lands_in_the_head_and_leaves_the_backbone(domain: str, tmp_path: Path) -> None:
    shapes = ol.authors_layout("anyloc_dinov2_vitg14_l31_value_c32")
    assert shapes == [(BARE_TENSOR_KEY, (32, 1536))]
    centres = ol.fill(shapes)[BARE_TENSOR_KEY]
    path = ol.save(centres, tmp_path / "c_centers.pt")  # torch.save of the bare tensor, as the release
    model = _model()
    backbone_before = {k: v.clone() for k, v in model.backbone.state_dict().items()}
    cfg = get_pretrained_cfg(f"anyloc_dinov2_vitg14.{domain}")
    report = load_checkpoint(model, path, remap=cfg.remap, contents=cfg.contents)
    assert report.loaded == ["head.centroids"] and all(k.startswith("backbone.") for k in report.kept)
    ol.assert_placed(model.head, {"c": centres}, {"c": "centroids"})
    for key, value in model.backbone.state_dict().items():
        assert torch.equal(value, backbone_before[key]), key
    with torch.no_grad():
        out = model.eval()(torch.randn(1, 3, 56, 84))
    assert out.shape == (1, 49152)


def test_released_vocabulary_through_the_weights_loader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``load_pretrained`` fetches the cfg's URL (a ``file://`` copy here) into the cache and converts it."""
    monkeypatch.setenv("AGGZOO_CACHE", str(tmp_path / "cache"))
    centres = ol.fill([(BARE_TENSOR_KEY, (32, 1536))])[BARE_TENSOR_KEY] / 1e5
    source = ol.save(centres, tmp_path / "dinov2_vitg14_l31_value_c32_indoor_c_centers.pt")
    model = _model()
    cfg = replace(get_pretrained_cfg("anyloc_dinov2_vitg14.indoor"), url=source.as_uri())
    with pytest.warns(UserWarning, match="no sha256 is pinned"):  # nobody here could download the release
        load_pretrained(model, cfg)
    assert torch.equal(model.head.centroids, centres)


def test_a_file_that_is_not_a_vocabulary_is_refused_in_one_message(tmp_path: Path) -> None:
    model = _model()
    cfg = get_pretrained_cfg("anyloc_dinov2_vitg14.urban")
    state_dict_file = ol.save({"head.centroids": torch.zeros(32, 1536)}, tmp_path / "state.pt")
    with pytest.raises(StateDictMismatchError, match="one bare tensor"):
        load_checkpoint(model, state_dict_file, remap=cfg.remap, contents=cfg.contents)
    wrong = ol.save(torch.zeros(16, 1536), tmp_path / "wrong.pt")
    with pytest.raises(StateDictMismatchError, match=r"head\.centroids checkpoint \(16, 1536\) vs model \(32, 1536\)"):
        load_checkpoint(model, wrong, remap=cfg.remap, contents=cfg.contents)
    vector = ol.save(torch.zeros(1536), tmp_path / "vector.pt")
    with pytest.raises(StateDictMismatchError, match=r"float \[num_clusters, channels\]"):
        load_checkpoint(model, vector, remap=cfg.remap, contents=cfg.contents)


def test_models_and_info_commands_show_the_vocabularies(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "anyloc*"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| anyloc")]
    assert sorted(row.split(" | ")[0][2:] for row in rows) == sorted(f"anyloc_dinov2_vitg14.{d}" for d in ANYLOC_DOMAINS)
    assert all(" | 49152 | 320x320 | https://github.com/AnyLoc/DINO/releases/download/v1/" in row for row in rows)
    assert main(["info", "anyloc_dinov2_vitg14.urban"]) == 0
    text = capsys.readouterr().out
    assert "key remap     aggzoo.zoo.anyloc.convert_anyloc_vocabulary" in text and "contents      delta" in text
    assert "dinov2_vitg14_l31_value_c32_urban_c_centers.pt" in text
