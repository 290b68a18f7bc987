"""Images -> descriptors: the one extraction loop of every evaluation.

Images are read and resized in DataLoader workers while the model runs, in file order (never shuffled:
batch-dependent heads give other descriptors for other batch compositions, see
:mod:`aggzoo.evaluation.batch_dependence`), and the ``[N, D]`` output is allocated once the first batch
reveals ``D``: in RAM, or as a memory-mapped ``.npy`` file whose bytes are reserved on disk first, so that a
large database never has to fit in RAM and a small disk fails with one message before anything is written.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from aggzoo.data.progress import progress_bar
from aggzoo.data.retrieval_set import ImageListDataset
from aggzoo.data.workers import loader_workers
from aggzoo.errors import DiskFullError
from aggzoo.evaluation.options import ExtractionOptions
from aggzoo.models.modes import evaluating

__all__ = ["extract_descriptors", "model_device", "open_store"]


def model_device(model: nn.Module) -> torch.device:
    """The device of ``model``'s first parameter (or buffer); the CPU for a model with neither."""
    for tensor in model.parameters():
        return tensor.device
    for tensor in model.buffers():
        return tensor.device
    return torch.device("cpu")


def open_store(path: str | Path, dtype: np.dtype | type, shape: tuple[int, ...]) -> np.memmap:
    """A new ``.npy`` file of ``shape`` memory-mapped for writing, its bytes reserved on disk first.

    A memory map over a sparse file that the disk cannot back dies with SIGBUS on the first page the kernel
    cannot allocate, with no message (and leaves the file behind). So the space is reserved up front
    (``posix_fallocate``, where the file system has it; a free-space check elsewhere) and a disk without
    room gives one :class:`~aggzoo.errors.DiskFullError` naming the folder and the bytes needed; the partial
    file is removed on every failure path.
    """
    path = Path(path)
    header = 128  # np.lib.format's header is padded to a multiple of 64 bytes; 128 covers any 2-D shape
    needed = int(np.prod(shape)) * np.dtype(dtype).itemsize + header
    free = shutil.disk_usage(path.parent).free
    if needed > free:
        raise DiskFullError(_no_room(path, needed, free))
    try:
        out = np.lib.format.open_memmap(path, mode="w+", dtype=np.dtype(dtype), shape=shape)
        if hasattr(os, "posix_fallocate") and needed > header:
            with open(path, "r+b") as handle:
                os.posix_fallocate(handle.fileno(), 0, path.stat().st_size)
    except OSError as err:
        path.unlink(missing_ok=True)
        if err.errno in (28, 122):  # ENOSPC, EDQUOT
            raise DiskFullError(_no_room(path, needed, shutil.disk_usage(path.parent).free)) from err
        raise
    return out


def _no_room(path: Path, needed: int, free: int) -> str:
    return (f"not enough disk space in {path.parent} for the descriptor store {path.name}: it needs "
            f"{needed / 2**20:.1f} MiB, {free / 2**20:.1f} MiB are free. Point evaluation.search.store_dir at a "
            "folder with room, or keep the descriptors in RAM (evaluation.search.refine_store=ram)")


def extract_descriptors(
    model: nn.Module,
    paths: Sequence[str | Any],
    transform: Callable[[np.ndarray], torch.Tensor],
    options: ExtractionOptions = ExtractionOptions(),
    *,
    out_path: str | Path | None = None,
    desc: str = "descriptors",
    boxes: Sequence[Any] | None = None,
) -> np.ndarray:
    """Global descriptors of images read one batch at a time.

    Memory is the ``[N, D]`` output plus one batch: images are never all loaded.

    Args:
        model: ``images [B, 3, H, W] -> [B, D]``. Run in eval mode under ``torch.inference_mode``;
            its training mode is restored afterwards, and it is moved back to its device.
        paths: ``N`` image files.
        transform: ``rgb uint8 [H, W, 3] -> float [3, H', W']`` (e.g. :func:`aggzoo.data.transforms.eval_transform`).
        options: batch size, workers, device, storage dtype, autocast precision, memory format, progress bar.
        out_path: write the descriptors to this ``.npy`` file, memory-mapped (``np.load(out_path,
            mmap_mode="r")`` reads it back), instead of an array in RAM (:func:`open_store`).
        desc: the progress bar's label.
        boxes: per image, ``None`` or an ``[x1, y1, x2, y2]`` crop applied before ``transform``
            (the revisited Oxford/Paris query boxes).

    Returns:
        ``[N, D]`` descriptors, row ``i`` for ``paths[i]`` (an ``np.memmap`` with ``out_path``).
    """
    home = model_device(model)
    device = options.torch_device or home
    dtype = np.dtype(options.descriptor_dtype)
    autocast_dtype = options.autocast_dtype
    dataset = ImageListDataset(paths, transform, boxes=boxes)
    loader = DataLoader(
        dataset, batch_size=int(options.batch_size), shuffle=False,
        num_workers=loader_workers(options.num_workers, len(paths)), pin_memory=device.type == "cuda",
        persistent_workers=False,
    )
    out: np.ndarray | None = None
    memory_format = torch.channels_last if options.channels_last else torch.preserve_format
    model.to(device, memory_format=memory_format)
    try:
        with evaluating(model), torch.inference_mode(), progress_bar(loader, options.progress, desc, unit="batch") as batches:
            for images, indices in batches:
                # pinned batches (pin_memory on CUDA) copy asynchronously, overlapping the previous forward
                images = images.to(device, non_blocking=True, memory_format=memory_format)
                with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                    descriptors = model(images)
                if descriptors.ndim != 2 or descriptors.shape[0] != images.shape[0]:
                    raise ValueError(
                        f"the model must return [B, D] descriptors, got shape {tuple(descriptors.shape)} "
                        f"for a batch of {images.shape[0]} images"
                    )
                if out is None:
                    shape = (len(paths), descriptors.shape[1])
                    out = np.empty(shape, dtype=dtype) if out_path is None else open_store(out_path, dtype, shape)
                out[indices.numpy()] = descriptors.float().cpu().numpy().astype(dtype, copy=False)
    finally:
        model.to(home)
        if options.channels_last:
            model.to(memory_format=torch.contiguous_format)
    if out is None:
        raise ValueError("no images to extract descriptors from (empty path list)")
    if isinstance(out, np.memmap):
        out.flush()
    return out
