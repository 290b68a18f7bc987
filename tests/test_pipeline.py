"""End to end through real Hydra composition: train on a tiny synthetic city, then evaluate the
checkpoint with eval's config, with the real Lightning Trainer and FAISS."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra_helpers import compose_run_config

import aggzoo
from aggzoo.run.evaluate import evaluate
from aggzoo.run.pipeline import train

TINY = ["synthetic=tiny", "backbone=test_resnet", "data.places_per_batch=6", "data.image_size=[48,64]",
        "data.eval_image_size=[48,64]", "callbacks.head_data_init.num_images=24",
        "callbacks.head_data_init.descriptors_per_image=8", "logger=csv_only"]


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, data_root: Path) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("train")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AGGZOO_DATA", str(data_root))
        cfg = compose_run_config("train", TINY + ["head=netvlad", "++head.num_clusters=8", "trainer.max_epochs=2"], out)
        result = train(cfg)
    return result, out


def test_train_writes_checkpoints_logs_and_results(trained: tuple[dict, Path]) -> None:
    result, out = trained
    assert (out / "checkpoints" / "last.ckpt").is_file()
    assert Path(result["best_checkpoint"]).is_file()
    assert list(out.glob("csv/*/metrics.csv"))
    rows = json.loads((out / "test_results.json").read_text())["results"]
    assert len(rows) == 3  # pooling baseline, untrained model, trained model, on synthetic_test
    summary = json.loads((out / "run_summary.json").read_text())
    assert (summary["head"], summary["head_class"]) == ("netvlad", "NetVLAD")  # the conf/head choice, the class
    trained_row = result["test"][0]
    assert trained_row.num_queries == 24 and set(trained_row.recalls) == {1, 5, 10, 20}
    assert 0.0 <= trained_row.recalls[1] <= trained_row.recalls[5] <= trained_row.recalls[20] <= 1.0
    assert result["trainer"].current_epoch == 2


def test_eval_rebuilds_the_checkpoint_and_reproduces_test_recall(
        trained: tuple[dict, Path], data_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result, _ = trained
    best = result["best_checkpoint"]
    monkeypatch.setenv("AGGZOO_DATA", str(data_root))
    cfg = compose_run_config("eval", ["synthetic=tiny", f"ckpt_path={best}", "image_size=[48,64]"], tmp_path)
    results = evaluate(cfg)
    assert results[0].recalls == result["test"][0].recalls
    assert (tmp_path / "results.json").is_file()
    model = aggzoo.create_model(str(best))
    assert model.out_dim == 8 * model.backbone.out_channels
