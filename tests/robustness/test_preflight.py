"""Before training/evaluation: a head that cannot take the backbone's output, bad sizes, too few
places, benchmarks without positives or with unreadable images -> one message with the fix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from PIL import Image

from aggzoo.data.retrieval_set import RetrievalSet
from aggzoo.models.heads.netvlad import NetVLAD
from aggzoo.models.vpr_model import VPRModel, build_head
from aggzoo.run.preflight import (
    PreflightError,
    benchmark_problems,
    build_model_checked,
    check_evaluation,
    check_training,
    model_problems,
)

CONF = Path(__file__).resolve().parents[2] / "conf"


def _cfg(backbone: str, head: str, **head_overrides: object) -> dict:
    head_cfg = OmegaConf.merge(OmegaConf.load(CONF / "head" / f"{head}.yaml"), head_overrides)
    return {"backbone": OmegaConf.load(CONF / "backbone" / f"{backbone}.yaml"), "head": head_cfg}


@pytest.fixture(scope="module")
def resnet() -> torch.nn.Module:
    return instantiate(OmegaConf.load(CONF / "backbone" / "test_resnet.yaml"))


@pytest.fixture(scope="module")
def vit() -> torch.nn.Module:
    return instantiate(OmegaConf.load(CONF / "backbone" / "test_vit.yaml"))


def _head(name: str, backbone: torch.nn.Module, **overrides: object) -> torch.nn.Module:
    return build_head(instantiate(OmegaConf.merge(OmegaConf.load(CONF / "head" / f"{name}.yaml"), overrides)), backbone)


def test_mixvpr_fixed_map_size(resnet: torch.nn.Module) -> None:
    model = VPRModel(resnet, _head("mixvpr", resnet))
    (problem,) = model_problems(model, (48, 64), "data.image_size")
    assert problem.startswith("head MixVPR cannot aggregate backbone test_resnet's output at 48x64 images "
                              "(data.image_size); the backbone gives maps [192, 3, 4] ([C, H, W], fine to coarse), "
                              "no CLS token. MixVPR was built for 20x20 feature maps and got 3x4: set head.in_h=3 "
                              "head.in_w=4 for these images, or use 320x320 images (stride 16)")
    assert model_problems(model, (320, 320), "data.image_size") == []  # 20x20 maps at stride 16


def test_salad_needs_a_cls_token_and_more_features_than_clusters(resnet: torch.nn.Module, vit: torch.nn.Module) -> None:
    (problem,) = model_problems(VPRModel(resnet, _head("salad", resnet)), (64, 64), "image_size")
    assert problem.endswith("no CLS token. SALAD needs a ViT backbone with a CLS token (features.cls); backbone "
                            "test_resnet gives none: use backbone=dinov2_vitb14 (or another timm ViT)")
    (problem,) = model_problems(VPRModel(vit, _head("salad", vit)), (32, 32), "image_size")
    assert problem.endswith("SALAD needs at least 65 local features (H*W of the feature map) and got n=4 (2x2): use "
                            "images of at least 144x144 (stride 16), or a smaller head configuration")
    assert "the backbone gives maps [64, 2, 2]" in problem
    assert model_problems(VPRModel(vit, _head("salad", vit, num_clusters=3)), (32, 32), "image_size") == []


def test_image_head_needs_aggregation_tokens(vit: torch.nn.Module) -> None:
    (problem,) = model_problems(VPRModel(vit, _head("image", vit)), (32, 32), "image_size")
    assert problem.endswith("a CLS token. ImAgeTokens reads aggregation tokens (features.tokens); backbone test_vit "
                            "inserts none: use backbone=image_dinov2_vitb14_reg4 (AggregationTokenViT)")


def test_vit_patch_multiple(vit: torch.nn.Module) -> None:
    (problem,) = model_problems(VPRModel(vit, _head("gem", vit)), (30, 50), "image_size")
    assert problem == ("backbone test_vit cannot take 30x50 images (image_size): AssertionError: Input height (30) "
                       "should be divisible by patch size (16). This ViT needs sizes divisible by its patch size "
                       "16x16, e.g. [32, 48].")


def test_head_built_for_other_channels(resnet: torch.nn.Module) -> None:
    (problem,) = model_problems(VPRModel(resnet, NetVLAD(7, num_clusters=4)), (32, 32), "image_size")
    assert problem.startswith("head NetVLAD was built for 7-channel features but backbone test_resnet gives 192 "
                              "channels. Build the head from the backbone")


def test_multilevel_head_on_a_single_level_backbone() -> None:
    with pytest.raises(PreflightError, match=r"^cannot build head aggzoo\.models\.heads\.ida\.IDA on backbone "
                                             r"test_resnet: IDA fuses several backbone levels"):
        build_model_checked(_cfg("test_resnet", "ida"))


def test_dry_forward_leaves_rng_and_mode_alone(resnet: torch.nn.Module) -> None:
    model = VPRModel(resnet, _head("gem", resnet)).train()
    state = torch.random.get_rng_state()
    assert model_problems(model, (32, 32), "image_size") == []
    assert torch.equal(torch.random.get_rng_state(), state) and model.training


def _set(tmp_path: Path, positives: list[list[int]], names: list[str] | None = None) -> RetrievalSet:
    folder = tmp_path / "bench"
    (folder / "db").mkdir(parents=True, exist_ok=True)
    (folder / "q").mkdir(exist_ok=True)
    db = []
    for i, name in enumerate(names or [f"{i}.png" for i in range(4)]):
        sub = folder / "db" / f"part{i % 2}"
        sub.mkdir(exist_ok=True)
        db.append(sub / name)
        Image.new("RGB", (8, 8), (i, 0, 0)).save(db[-1])
    queries = [folder / "q" / f"{i}.png" for i in range(len(positives))]
    for q in queries:
        Image.new("RGB", (8, 8)).save(q)
    return RetrievalSet("bench", tuple(db), tuple(queries), tuple(np.array(p, dtype=np.int64) for p in positives))


def test_benchmark_positives_and_duplicates(tmp_path: Path) -> None:
    problems, notes = benchmark_problems(_set(tmp_path, [[0], [], [1, 2]]))
    assert problems == [] and notes == [
        "bench: 1 of 3 queries have no positive in the ground truth; they count as misses (Recall@k is over all "
        "queries, as in the standard protocols)"]
    problems, _ = benchmark_problems(_set(tmp_path / "none", [[], []]), role="test benchmark")
    assert problems == [
        "no query of test benchmark 'bench' has a positive database image, so every Recall@k would be 0: the ground "
        "truth does not match the images (for the VG layout: wrong positive_radius_m, or UTM coordinates in "
        "different units for queries and database)"]
    _, notes = benchmark_problems(_set(tmp_path / "dup", [[0]], names=["a.png", "b.png", "a.png", "c.png"]))
    assert notes[0].startswith("bench: 1 file names occur more than once in its database (e.g. [")
    assert "was the dataset extracted twice?" in notes[0]


class _Places:
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


def test_training_problems_are_listed_together(tmp_path: Path, resnet: torch.nn.Module) -> None:
    model = VPRModel(resnet, _head("mixvpr", resnet))
    broken = _set(tmp_path, [[0], [1]])
    broken.query_paths[1].write_text("not an image")
    with pytest.raises(PreflightError) as info:
        check_training(model, train_dataset=_Places(5), places_per_batch=8,
                       sizes={"data.image_size": (48, 64), "data.eval_image_size": (320, 320)}, val_sets={"bench": broken}, test_sets={})
    message = str(info.value)
    assert message.startswith("cannot start training, 3 problems:\n  1. head MixVPR cannot aggregate")
    assert "\n  2. data.places_per_batch=8 but the training set has only 5 places" in message
    assert (f"\n  3. 1 of 6 images of benchmark 'bench' cannot be read: {broken.query_paths[1]}: not an image Pillow "
            "can identify") in message


def test_evaluation_image_size_must_be_two_positive_integers(tmp_path: Path, resnet: torch.nn.Module) -> None:
    model = VPRModel(resnet, _head("gem", resnet))
    sets = {"bench": _set(tmp_path, [[0]])}
    for size in ([320], [0, 320], ["a", 3], [2.5, 3]):
        with pytest.raises(PreflightError, match=r"^cannot start evaluation: image_size must be \[height, width\]"):
            check_evaluation(model, image_size=size, sets=sets)
    assert check_evaluation(model, image_size=[32, 32], sets=sets).problems == []
