"""Through the real pipeline (Hydra composition, Lightning, FAISS) on data written here: a seeded
run twice gives identical weights, descriptors and metrics while skipping a corrupt training image;
evaluation fails or skips on unreadable images; a bad head/size combination stops before training."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra_helpers import compose_run_config
from robust_helpers import write_city, write_vg

import aggzoo
from aggzoo.data.images import ImageReadError
from aggzoo.data.transforms import eval_transform
from aggzoo.evaluation.extraction import extract_descriptors
from aggzoo.run.evaluate import evaluate
from aggzoo.run.pipeline import train
from aggzoo.run.preflight import PreflightError


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("data")
    paths = write_city(root / "city", [3] * 11 + [2])
    bad = paths[11][0]  # place 11 has two images, K = 2: it cannot be drawn and is replaced
    bad.write_bytes(bad.read_bytes()[:30])
    write_vg(root / "vg", "val", num_places=6)
    write_vg(root / "vg", "test", num_places=8, queries_per_place=2, seed=1)
    return {"city": root / "city", "vg": root / "vg", "bad": bad}


def _train_cfg(data: dict[str, Path], out: Path, extra: list[str] = ()):
    return compose_run_config("train", [
        "backbone=test_resnet", "head=gem", f"data.train.root={data['city']}", "data.train.img_per_place=2",
        "data.places_per_batch=4", "data.image_size=[32,32]", "data.eval_image_size=[32,32]",
        f"val_benchmarks.synthetic_val.root={data['vg']}", f"test_benchmarks.synthetic_test.root={data['vg']}",
        "trainer.max_epochs=1", "trainer.accelerator=cpu", "logger=csv_only", "evaluate_baseline=false",
        "callbacks.progress_bar.refresh_rate=0", *extra], out)


@pytest.mark.slow
def test_seeded_training_twice_is_identical_and_skips_the_bad_image(data: dict[str, Path], tmp_path: Path) -> None:
    runs = [train(_train_cfg(data, tmp_path / f"run{i}")) for i in range(2)]
    states = [torch.load(r["best_checkpoint"], map_location="cpu", weights_only=True)["state_dict"] for r in runs]
    assert states[0].keys() == states[1].keys()
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    assert runs[0]["test"][0].recalls == runs[1]["test"][0].recalls
    assert np.array_equal(runs[0]["test"][0].predictions, runs[1]["test"][0].predictions)
    test_set = runs[0]["test"][0].retrieval_set
    descriptors = [extract_descriptors(aggzoo.create_model(r["best_checkpoint"]), test_set.query_paths,
                                       eval_transform((32, 32))) for r in runs]
    assert np.array_equal(*descriptors)
    for i, run in enumerate(runs):
        listed = (tmp_path / f"run{i}" / "bad_images.tsv").read_text()
        assert f"{data['bad']}\t" in listed and "place:11\tfewer than 2 readable images; replaced by place 0" in listed
        assert set(run["bad_images"]) == {str(data["bad"]), "place:11"}


def _eval_cfg(data: dict[str, Path], out: Path, extra: list[str] = ()):
    return compose_run_config("eval", ["backbone=test_resnet", "head=gem", "image_size=[32,32]",
                             f"benchmark.synthetic_test.root={data['root']}", *extra], out)


def test_evaluation_fails_or_skips_unreadable_images(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    root = write_vg(tmp_path / "vg", "test", num_places=6)
    data = {"root": root}
    database = sorted((root / "images" / "test" / "database").iterdir())
    queries = sorted((root / "images" / "test" / "queries").iterdir())
    queries[4].write_bytes(queries[4].read_bytes()[:60])  # truncated: passes the header scan ...
    with pytest.raises(ImageReadError, match=r"cannot read image .*@p004@q0@\.png: truncated or corrupt"):
        evaluate(_eval_cfg(data, tmp_path / "fail"))  # ... and stops the extraction
    database[2].write_bytes(b"")  # empty: found by the scan before any extraction
    with pytest.raises(PreflightError, match=r"^cannot start evaluation: 1 of 12 images of benchmark 'synthetic_test' "
                                             r"cannot be read: .*@p002@\.png: empty file \(0 bytes\)\. Fix or remove"):
        evaluate(_eval_cfg(data, tmp_path / "fail2"))
    results = evaluate(_eval_cfg(data, tmp_path / "skip", ["bad_images=skip"]))
    result = results[0]
    assert (result.num_database, result.num_queries) == (5, 5)
    assert result.extras == {"skipped_database_images": 1, "skipped_queries": 1}
    assert result.queries_without_positive == 1  # query 2 lost its only positive
    saved = json.loads((tmp_path / "skip" / "results.json").read_text())["results"][0]
    assert saved["skipped_database_images"] == 1 and saved["skipped_queries"] == 1
    assert sorted((tmp_path / "skip" / "bad_images.tsv").read_text().splitlines()) == [
        f"{database[2]}\tempty file (0 bytes)", f"{queries[4]}\ttruncated or corrupt image data (image file is truncated)"]
    printed = capsys.readouterr().out
    assert "note: synthetic_test: 1 of 5 queries have no positive; they count as misses" in printed
    assert ("note: synthetic_test: evaluated without 1 database images and 1 queries that could not be read (listed "
            f"in {tmp_path / 'skip' / 'bad_images.tsv'}); not comparable to published numbers") in printed


def test_bad_head_for_the_image_size_stops_before_training(data: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(PreflightError, match=r"^cannot start training: head MixVPR cannot aggregate backbone "
                                             r"test_resnet's output at 32x32 images \(data\.image_size\)"):
        train(_train_cfg(data, tmp_path, ["head=mixvpr"]))
    assert not (tmp_path / "checkpoints").exists()
