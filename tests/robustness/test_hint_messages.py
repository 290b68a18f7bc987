"""Hints name a setting that exists and applies (issue 14 item 7)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image

from aggzoo.data.images import read_rgb
from aggzoo.data.retrieval_set import RetrievalSet
from aggzoo.errors import CheckpointError, DatasetLayoutError, ImageReadError
from aggzoo.models.features import Features

CONF = Path(__file__).resolve().parents[2] / "conf"


def _benchmark(name: str, tmp_path: Path):
    cfg = OmegaConf.create({"paths": {"data_root": str(tmp_path / "data"), "shared_data": str(tmp_path / "shared")},
                            "benchmark": OmegaConf.load(CONF / "benchmark" / f"{name}.yaml")})
    return cfg.benchmark


def test_missing_nordland_mini_names_paths_shared_data(tmp_path: Path) -> None:
    from aggzoo.run.benchmark_config import load_benchmarks

    with pytest.raises(DatasetLayoutError) as err:
        load_benchmarks(_benchmark("nordland_mini", tmp_path))
    message = str(err.value)
    assert "paths.shared_data=<folder holding nordland_mini/> or AGGZOO_SHARED_DATA=" in message
    assert "benchmark.nordland_mini.root=" in message and "paths.data_root" not in message


def test_missing_public_benchmark_names_paths_data_root_and_its_own_name(tmp_path: Path) -> None:
    from aggzoo.run.benchmark_config import load_benchmarks

    with pytest.raises(DatasetLayoutError, match=r"paths\.data_root=/your/datasets or AGGZOO_DATA=.*"
                                                 r"benchmark\.tokyo247\.root="):
        load_benchmarks(_benchmark("tokyo247", tmp_path))


def test_unreadable_benchmark_image_in_train_py_does_not_suggest_bad_images(tmp_path: Path) -> None:
    from aggzoo.run.preflight import _TRAIN_IMAGE_FIX, _scan_sets

    db = [tmp_path / f"db{i}.png" for i in range(2)]
    for i, p in enumerate(db):
        Image.new("RGB", (4, 4), (i, 0, 0)).save(p)
    query = tmp_path / "q.png"
    query.write_bytes(b"")
    sets = {"toy": RetrievalSet("toy", tuple(db), (query,), (np.array([0]),))}
    (train_problem,) = _scan_sets(sets, "header", 0, _TRAIN_IMAGE_FIX)
    assert "q.png" in train_problem and "val_benchmarks" in train_problem
    assert "evaluate without them with bad_images=skip" not in train_problem
    (eval_problem,) = _scan_sets(sets, "header", 0)
    assert "bad_images=skip" in eval_problem


def test_mixvpr_hint_is_the_override() -> None:
    from aggzoo.models.heads.mixvpr import MixVPR

    head = MixVPR(8, in_h=4, in_w=4)
    with pytest.raises(ValueError, match=r"head\.in_h=5 head\.in_w=6 on the train\.py / eval\.py command line"):
        head(Features(maps=(torch.randn(1, 8, 5, 6),)))


def test_salad_hint_is_a_backbone_option() -> None:
    from aggzoo.models.heads.salad import SALAD

    with pytest.raises(ValueError, match=r"backbone=dinov2_vitb14 on the train\.py / eval\.py command line"):
        SALAD(8)(Features(maps=(torch.randn(1, 8, 4, 4),)))
    assert (CONF / "backbone" / "dinov2_vitb14.yaml").is_file()


def test_huge_image_hint_does_not_offer_a_command_line_setting(tmp_path: Path) -> None:
    path = tmp_path / "big.png"
    Image.new("RGB", (64, 64)).save(path)
    with pytest.raises(ImageReadError, match="no command-line option") as err:
        read_rgb(path, max_pixels=100)
    assert "or raise" not in str(err.value)


def test_random_bytes_are_called_corrupt(tmp_path: Path) -> None:
    import aggzoo

    path = tmp_path / "random.pth"
    path.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(CheckpointError, match="corrupt") as err:
        aggzoo.create_model(str(path))
    assert "import or call code" not in str(err.value)


def test_hubconf_docstring_does_not_call_hub_list_on_a_local_folder() -> None:
    lines = (CONF.parent / "hubconf.py").read_text().splitlines()
    assert not [line for line in lines if "torch.hub.list(" in line and "local" in line]


def test_eval_without_checkpoint_says_the_model_is_untrained() -> None:
    """Issue 14 item 6: eval.py with no ckpt_path evaluated an untrained model without saying so."""
    from aggzoo.models.backbones.timm_backbone import TimmBackbone
    from aggzoo.models.heads.gem import GeM
    from aggzoo.models.vpr_model import VPRModel
    from aggzoo.run.evaluate import untrained_note

    note = untrained_note(VPRModel(TimmBackbone("test_resnet", out_indices=(3,)), GeM))
    assert note.startswith("note: no ckpt_path given") and "untrained GeM head" in note and "ckpt_path=<" in note
