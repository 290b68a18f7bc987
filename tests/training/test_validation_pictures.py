"""Validation pictures reach the experiment loggers: one tiny real training run (real Trainer, real
loggers), then each logger's own files are read back -- TensorBoard's event file with its
EventAccumulator; wandb's offline run folder and MLflow's file store when those extras are installed."""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from train_helpers import TINY, compose_train

from aggzoo.run.pipeline import train
from aggzoo.training.pictures import CURVE_TAG, GRID_TAG, image_writer

HAS_WANDB = importlib.util.find_spec("wandb") is not None
HAS_MLFLOW = importlib.util.find_spec("mlflow") is not None
#: the logger options of conf/logger this run selects: each of wandb.yaml / mlflow.yaml adds its
#: logger to the default CSV + TensorBoard pair
EXTRA_LOGGERS = [name for name, present in (("wandb", HAS_WANDB), ("mlflow", HAS_MLFLOW)) if present]
EPOCHS = 2
GRID = GRID_TAG.format(name="synthetic_val")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, tiny_data) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("pictures_run")
    logger = f"logger=[{','.join(EXTRA_LOGGERS)}]" if EXTRA_LOGGERS else "logger=default"
    overrides = [o for o in TINY if not o.startswith("logger=")] + [
        logger, "head=gem", "data.places_per_batch=6", f"trainer.max_epochs={EPOCHS}", "trainer.limit_train_batches=2",
        "evaluate_baseline=false", "benchmark@test_benchmarks=[]",
        f"paths.log_dir={out / 'logs'}"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AGGZOO_DATA", str(tiny_data.root))
        mp.setenv("WANDB_SILENT", "true")
        mp.setenv("WANDB_DIR", str(out))  # wandb's own settings/cache files stay in the test folder
        result = train(compose_train(overrides, out))
    return result, out


def _png(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def _has_frame_colours(image: np.ndarray) -> bool:
    """The grid frames its cells in matplotlib's tab:green / tab:red / tab:blue (query)."""
    colours = {(44, 160, 44), (214, 39, 40), (31, 119, 180)}
    pixels = {tuple(p) for p in image.reshape(-1, 3)[:: 7].tolist()}
    return len(colours & pixels) >= 2


def test_tensorboard_event_file_holds_the_curve_and_the_grid_of_every_validation(run) -> None:
    from tensorboard.backend.event_processing.event_accumulator import IMAGES, SCALARS, EventAccumulator

    result, out = run
    events = sorted((out / "tensorboard").rglob("events.out.tfevents.*"))
    assert events, f"no TensorBoard event file under {out / 'tensorboard'}"
    accumulator = EventAccumulator(str(events[0].parent), size_guidance={IMAGES: 0, SCALARS: 0}).Reload()
    tags = accumulator.Tags()
    assert {CURVE_TAG, GRID} <= set(tags["images"]), tags["images"]
    # One picture per validation epoch (not the sanity check), at the steps val/R@1 was logged.
    val_steps = [e.step for e in accumulator.Scalars("val/R@1")]
    assert len(val_steps) == EPOCHS
    for tag in (CURVE_TAG, GRID):
        pictures = accumulator.Images(tag)
        assert [p.step for p in pictures] == val_steps
        image = _png(pictures[-1].encoded_image_string)
        assert (pictures[-1].height, pictures[-1].width) == image.shape[:2]
        assert image.std() > 10  # drawn, not a blank canvas
    curve = _png(accumulator.Images(CURVE_TAG)[-1].encoded_image_string)
    assert curve.shape[:2] == (440, 640)  # the recall_curves_figure size at 100 dpi
    assert _has_frame_colours(_png(accumulator.Images(GRID)[-1].encoded_image_string))
    assert result["trainer"].current_epoch == EPOCHS


def test_csv_logger_takes_no_images(run) -> None:
    result, _ = run
    kinds = {type(lg).__name__: image_writer(lg) is not None for lg in result["trainer"].loggers}
    assert kinds["CSVLogger"] is False and kinds["TensorBoardLogger"] is True


@pytest.mark.skipif(not HAS_WANDB, reason="wandb not installed (pip install 'aggzoo[wandb]'); CI installs only .[test]")
def test_wandb_offline_run_holds_the_pictures(run) -> None:
    _, out = run
    runs = sorted((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, f"expected one offline wandb run under {out / 'wandb'}"
    media = runs[0] / "files" / "media" / "images" / "val"
    curves = sorted(media.glob("recall_curve_*.png"))
    grids = sorted((media / "retrievals").glob("synthetic_val_*.png"))
    assert len(curves) == EPOCHS and len(grids) == EPOCHS
    assert _png(curves[-1].read_bytes()).shape[:2] == (440, 640)
    assert _has_frame_colours(_png(grids[-1].read_bytes()))


@pytest.mark.skipif(not HAS_MLFLOW, reason="mlflow not installed (pip install 'aggzoo[mlflow]'); CI installs only .[test]")
def test_mlflow_file_store_holds_the_pictures_and_the_metrics(run) -> None:
    from mlflow.tracking import MlflowClient

    result, out = run
    (mlflow_logger,) = [lg for lg in result["trainer"].loggers if type(lg).__name__ == "MLFlowLogger"]
    store = out / "logs" / "mlflow" / "mlflow.db"  # conf/logger/mlflow.yaml: a SQLite store under paths.log_dir
    assert store.is_file()
    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    run_id = mlflow_logger.run_id
    # Lightning drops '@' from metric names for MLflow: val/R@1 is val/R1.
    history = client.get_metric_history(run_id, "val/R1")
    assert len(history) == EPOCHS and all(0.0 <= m.value <= 1.0 for m in history)
    # MLflow names stepped images <key with / as ~>+step+<step>+...png (plus a compressed .webp preview)
    images = [Path(a.path).name for a in client.list_artifacts(run_id, "images") if a.path.endswith(".png")]
    val_steps = [m.step for m in history]
    for tag in (CURVE_TAG, GRID):
        steps = sorted(int(n.split("+step+")[1].split("+")[0]) for n in images if n.startswith(tag.replace("/", "~") + "+"))
        assert steps == val_steps, f"{tag}: images at steps {steps}, val/R1 at {val_steps} ({images})"
    last_grid = max((n for n in images if n.startswith(GRID.replace("/", "~") + "+")),
                    key=lambda n: int(n.split("+step+")[1].split("+")[0]))
    local = client.download_artifacts(run_id, f"images/{last_grid}", str(out / "download"))
    assert _has_frame_colours(_png(Path(local).read_bytes()))
