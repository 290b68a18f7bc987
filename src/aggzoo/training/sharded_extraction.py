"""Descriptor extraction sharded across Lightning ranks: ``python eval.py trainer=ddp trainer.devices=N``.

Lightning's predict loop runs the model on every rank: its DDP strategy launches the processes (re-running
the entry point, as for training) and gives each rank its part of the image list through
``UnrepeatedDistributedSamplerWrapper`` (rank ``r`` of ``W`` gets images ``r, r + W, ...``). A
:class:`~lightning.pytorch.callbacks.BasePredictionWriter` writes each rank's rows, with their image
indices, into its own memory-mapped shard (``<name>.rank<r>.npy`` / ``.idx.npy``). After a barrier rank 0
merges the shards into one ``[N, D]`` ``.npy`` in image order -- dropping any repeated index (a sampler
that pads with duplicates, as ``DistributedSampler`` does, would otherwise count an image twice) and
refusing a missing one -- and deletes the shards; after a second barrier every rank reads the merged
file, memory-mapped. The search then runs on it as on one process's descriptors (one FAISS index, exact
or two-stage), so the predictions are those of one process.

This lives in ``training/`` because it is Lightning code (``evaluation/`` imports no Lightning).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as L
import numpy as np
import torch
from lightning.pytorch.callbacks import BasePredictionWriter
from torch import nn
from torch.utils.data import DataLoader

from aggzoo.data.retrieval_set import ImageListDataset
from aggzoo.data.workers import loader_workers
from aggzoo.evaluation.options import ExtractionOptions

__all__ = ["ShardedExtractor", "ShardWriter", "merge_shards"]


class _Predict(L.LightningModule):
    """``predict_step``: ``(images [B, 3, H, W], indices [B]) -> (descriptors [B, D], indices [B])``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def predict_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        images, indices = batch
        descriptors = self.model(images)
        if descriptors.ndim != 2 or descriptors.shape[0] != images.shape[0]:
            raise ValueError(f"the model must return [B, D] descriptors, got shape {tuple(descriptors.shape)} "
                             f"for a batch of {images.shape[0]} images")
        return descriptors, indices


def _shard_paths(stem: Path, rank: int) -> tuple[Path, Path]:
    return stem.with_name(f"{stem.name}.rank{rank}.npy"), stem.with_name(f"{stem.name}.rank{rank}.idx.npy")


class ShardWriter(BasePredictionWriter):
    """Writes each rank's ``(descriptors, indices)`` batches into its memory-mapped shard, batch by batch
    (a rank never holds its shard in RAM). Point it at a new shard with :meth:`start` before each predict."""

    def __init__(self) -> None:
        super().__init__(write_interval="batch")
        self.stem: Path | None = None
        self.dtype: np.dtype = np.dtype(np.float32)
        self._rows: np.ndarray | None = None
        self._ids: np.ndarray | None = None
        self._filled = 0

    def start(self, stem: Path, dtype: np.dtype) -> None:
        self.stem, self.dtype = stem, np.dtype(dtype)
        self._rows = self._ids = None
        self._filled = 0

    def write_on_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, prediction: Any,
                           batch_indices: Sequence[int] | None, batch: Any, batch_idx: int,
                           dataloader_idx: int) -> None:
        descriptors, indices = prediction
        if self._rows is None:
            assert self.stem is not None, "ShardWriter.start() names the shard before predict"
            # Room for the whole list: which share a rank gets is the sampler's business (Lightning's predict
            # sampler gives ~N/W, a padding one more); the unwritten tail of a sparse file costs no disk.
            num_rows = len(trainer.predict_dataloaders.dataset) if not isinstance(
                trainer.predict_dataloaders, (list, tuple)) else len(trainer.predict_dataloaders[dataloader_idx].dataset)
            rows_path, ids_path = _shard_paths(self.stem, trainer.global_rank)
            self._rows = np.lib.format.open_memmap(rows_path, mode="w+", dtype=self.dtype,
                                                   shape=(num_rows, descriptors.shape[1]))
            self._ids = np.lib.format.open_memmap(ids_path, mode="w+", dtype=np.int64, shape=(num_rows,))
            self._ids[:] = -1  # rows past the last one written are marked empty
        stop = self._filled + len(indices)
        self._rows[self._filled:stop] = descriptors.float().cpu().numpy().astype(self.dtype, copy=False)
        self._ids[self._filled:stop] = indices.cpu().numpy()
        self._filled = stop

    def finish(self, rank: int) -> None:
        """Flush rank ``rank``'s shard (a rank given no image writes an empty one) and close it."""
        if self._rows is None:
            assert self.stem is not None
            rows_path, ids_path = _shard_paths(self.stem, rank)
            np.save(rows_path, np.zeros((0, 0), dtype=self.dtype))
            np.save(ids_path, np.zeros((0,), dtype=np.int64))
        else:
            self._rows.flush()
            self._ids.flush()
        self._rows = self._ids = None


def merge_shards(stem: Path, world_size: int, num_rows: int, out_path: Path, dtype: np.dtype) -> np.ndarray:
    """Rank shards ``<stem>.rank<r>.npy`` -> one ``[N, D]`` ``.npy`` at ``out_path``, row ``i`` for image ``i``.

    Each image's first row is kept, a repeated index is dropped; an index that no shard holds is an
    error. The shards are deleted afterwards.
    """
    out: np.ndarray | None = None
    seen = np.zeros(num_rows, dtype=bool)
    for rank in range(world_size):
        rows_path, ids_path = _shard_paths(stem, rank)
        rows, ids = np.load(rows_path, mmap_mode="r"), np.load(ids_path)
        filled = int((ids >= 0).sum())  # written rows come first, then the -1 tail
        rows, ids = rows[:filled], ids[:filled]
        if filled == 0:
            continue
        if out is None:
            out = np.lib.format.open_memmap(out_path, mode="w+", dtype=np.dtype(dtype), shape=(num_rows, rows.shape[1]))
        fresh_ids, first = np.unique(ids, return_index=True)  # sorted ids, each one's first position
        keep = first[~seen[fresh_ids]]
        order = np.argsort(ids[keep], kind="stable")
        keep = keep[order]
        out[ids[keep]] = rows[keep]
        seen[ids[keep]] = True
    missing = np.flatnonzero(~seen)
    if out is None or missing.size:
        raise RuntimeError(f"descriptor shards {stem}.rank*.npy miss {missing.size} of {num_rows} images "
                           f"(first: {missing[:5].tolist()})")
    out.flush()
    for rank in range(world_size):
        for path in _shard_paths(stem, rank):
            path.unlink()
    return out


class ShardedExtractor:
    """A drop-in for :func:`aggzoo.evaluation.extraction.extract_descriptors` that runs Lightning's predict
    loop on every rank of ``trainer`` and returns the merged ``[N, D]`` descriptors (memory-mapped).

    Every rank must make the same calls in the same order (they do: each runs the same job).

    Args:
        trainer: a Lightning trainer (e.g. ``conf/trainer/ddp.yaml``); it is given a :class:`ShardWriter`.
        folder: where shards and merged files go; the same path on every rank (a shared file system).
    """

    def __init__(self, trainer_factory: Callable[..., L.Trainer], folder: str | Path) -> None:
        self.writer = ShardWriter()
        self.trainer = trainer_factory(callbacks=[self.writer], logger=False)
        self.folder = Path(folder)
        self._calls = 0

    @property
    def world_size(self) -> int:
        return int(self.trainer.world_size)

    @property
    def is_global_zero(self) -> bool:
        """Whether this process is rank 0, known before the first predict launches the others (the
        launched ranks receive their rank in the environment, which the trainer reads when built)."""
        return bool(self.trainer.is_global_zero)

    def __call__(self, model: nn.Module, paths: Sequence[Any], transform: Callable[[np.ndarray], torch.Tensor],
                 options: ExtractionOptions = ExtractionOptions(), *, out_path: str | Path | None = None,
                 desc: str = "descriptors", boxes: Sequence[Any] | None = None) -> np.ndarray:
        """``[N, D]`` descriptors of ``paths``, as :func:`extract_descriptors` returns them. ``options.device``,
        ``precision`` and ``progress`` are the trainer's (``accelerator``, ``precision``, its bar)."""
        self._calls += 1
        self.folder.mkdir(parents=True, exist_ok=True)
        stem = self.folder / f"extract{self._calls:03d}"
        dtype = np.dtype(options.descriptor_dtype)
        dataset = ImageListDataset(paths, transform, boxes=boxes)
        loader = DataLoader(dataset, batch_size=int(options.batch_size), shuffle=False,
                            num_workers=loader_workers(options.num_workers, len(paths), processes=self.trainer.num_devices),
                            persistent_workers=False)
        self.writer.start(stem, np.dtype(dtype))
        self.trainer.predict(_Predict(model), dataloaders=loader, return_predictions=False)
        self.writer.finish(self.trainer.global_rank)
        target = Path(out_path) if out_path is not None else stem.with_name(f"{stem.name}.npy")
        strategy = self.trainer.strategy
        strategy.barrier("aggzoo-shards-written")
        if self.trainer.is_global_zero:
            merge_shards(stem, self.world_size, len(paths), target, np.dtype(dtype))
        strategy.barrier("aggzoo-shards-merged")
        return np.load(target, mmap_mode="r")
