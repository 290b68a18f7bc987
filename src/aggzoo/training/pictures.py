"""Validation pictures for the experiment loggers: the Recall@k curve and a retrieval grid.

After each validation :class:`ValidationPictures` draws the curves of every validation set on one
figure and one retrieval grid per set (the same pictures ``eval.py`` writes as PNG files, from
:mod:`aggzoo.evaluation.report`) and hands them, as ``uint8 [H, W, 3]`` arrays, to every logger of
the trainer that takes images. Each logger is asked what it can do, by the methods it has (no logger
class is imported, so wandb and MLflow stay optional):

- TensorBoard (``SummaryWriter.add_image``): ``<tag>`` images stepped by the global step;
- Weights & Biases (``WandbLogger.log_image``): media panels of the run;
- MLflow (``MlflowClient.log_image`` with the logger's ``run_id``): images of the run, stepped;
- a logger with none of these (CSV) is left out.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import lightning.pytorch as L
import numpy as np

from aggzoo.evaluation.report import figure_rgb, pick_queries, recall_curves_figure, retrievals_figure
from aggzoo.evaluation.result import RetrievalResult, result_from_predictions

__all__ = ["ValidationPictures", "image_writer", "CURVE_TAG", "GRID_TAG"]


#: Image names in the loggers (the grid's gets the validation set's name).
CURVE_TAG = "val/recall_curve"
GRID_TAG = "val/retrievals/{name}"

#: ``(tag, image uint8 [H, W, 3], global step)``
ImageWriter = Callable[[str, np.ndarray, int], None]


def _tensorboard(experiment: Any) -> ImageWriter:
    def write(tag: str, image: np.ndarray, step: int) -> None:
        experiment.add_image(tag, image, global_step=step, dataformats="HWC")
        experiment.flush()  # the pictures of a short run reach the event file before the process ends
    return write


def _wandb(logger: Any) -> ImageWriter:
    def write(tag: str, image: np.ndarray, step: int) -> None:
        # Lightning's WandbLogger logs the step as the trainer/global_step metric, as for val/R@1.
        logger.log_image(key=tag, images=[image], step=step, caption=[f"step {step}"])
    return write


def _mlflow(client: Any, run_id: str) -> ImageWriter:
    def write(tag: str, image: np.ndarray, step: int) -> None:
        # MLflow keys allow letters, digits, _ - . / and spaces only (a set's name may hold others)
        client.log_image(run_id, image, key=re.sub(r"[^\w\-./ ]", "_", tag), step=step)
    return write


def image_writer(logger: Any) -> ImageWriter | None:
    """How ``logger`` (a Lightning logger) takes an image, or ``None`` when it takes none."""
    if callable(getattr(logger, "log_image", None)):  # WandbLogger (and others with Lightning's image API)
        return _wandb(logger)
    experiment = logger.experiment
    if callable(getattr(experiment, "add_image", None)):  # torch's SummaryWriter (TensorBoardLogger)
        return _tensorboard(experiment)
    run_id = getattr(logger, "run_id", None)
    if callable(getattr(experiment, "log_image", None)) and run_id:  # MlflowClient (MLFlowLogger)
        return _mlflow(experiment, run_id)
    return None


class ValidationPictures(L.Callback):
    """Logs the validation Recall@k curve and retrieval grids as images (see the module docstring).

    Args:
        grid_queries: query rows of each retrieval grid (half answered correctly at rank 1, half
            not, the same queries every epoch).
        grid_k: retrievals per row.
        thumb_height: pixel height of each thumbnail in the grid.
        every_n_epochs: draw after every n-th validation epoch (and never in the sanity check).
        seed: picks the grid's queries.
    """

    def __init__(self, *, grid_queries: int = 4, grid_k: int = 4, thumb_height: int = 72, every_n_epochs: int = 1,
                 seed: int = 0) -> None:
        if grid_queries < 1 or grid_k < 1 or every_n_epochs < 1:
            raise ValueError("ValidationPictures: grid_queries, grid_k and every_n_epochs must be >= 1")
        self.grid_queries = grid_queries
        self.grid_k = grid_k
        self.thumb_height = thumb_height
        self.every_n_epochs = every_n_epochs
        self.seed = seed
        self._queries: dict[str, list[int]] = {}

    def _results(self, trainer: L.Trainer, module: L.LightningModule) -> list[RetrievalResult]:
        sets = getattr(trainer.datamodule, "val_sets", None) or {}
        ks: Sequence[int] = getattr(module, "recall_ks", (1,))
        results = []
        for name, predictions in getattr(module, "val_predictions", {}).items():
            if name in sets:
                width = predictions.shape[1]
                results.append(result_from_predictions(sets[name], predictions, [k for k in ks if k <= width] or [1]))
        return results

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # After the module's on_validation_epoch_end (Lightning calls callbacks' epoch-end hooks first).
        if trainer.sanity_checking or not trainer.is_global_zero or trainer.current_epoch % self.every_n_epochs:
            return
        writers = [w for w in (image_writer(lg) for lg in trainer.loggers) if w is not None]
        results = self._results(trainer, pl_module) if writers else []
        if not results:
            return
        # The step Lightning hands the loggers with val/R@1 (one less than global_step after the
        # epoch's last batch), so a picture sits at the same step as the numbers it shows.
        step = getattr(trainer.fit_loop.epoch_loop, "_batches_that_stepped", trainer.global_step)
        images = {CURVE_TAG: figure_rgb(recall_curves_figure(
            results, title=f"validation Recall@k, epoch {trainer.current_epoch}, step {step}"))}
        for result in results:
            # Fixed rows, so the grid shows the same queries improving over the epochs.
            if result.name not in self._queries:
                self._queries[result.name] = pick_queries(result, self.grid_queries, self.seed)
            figure = retrievals_figure(result, queries=self._queries[result.name], k=self.grid_k,
                                       thumb_height=self.thumb_height)
            images[GRID_TAG.format(name=result.name)] = figure_rgb(figure)
        for write in writers:
            for tag, image in images.items():
                write(tag, image, step)

