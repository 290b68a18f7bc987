"""Default DataLoader workers for reading images (aggzoo.data.workers) and their use in extraction."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from image_files import write_noise_images

from aggzoo.data import workers
from aggzoo.data.workers import AUTO_MIN_IMAGES, MAX_AUTO_WORKERS, loader_workers
from aggzoo.evaluation.extraction import extract_descriptors
from aggzoo.evaluation.options import ExtractionOptions


def test_explicit_count_is_used_as_given(monkeypatch):
    monkeypatch.setattr(workers, "usable_cores", lambda: 16)
    assert loader_workers(0, 10**6) == 0
    assert loader_workers(3, 1) == 3


@pytest.mark.parametrize(("cores", "images", "processes", "expected"), [
    (16, AUTO_MIN_IMAGES - 1, 1, 0),          # small set: the main process reads it
    (1, 10**5, 1, 0),                          # one core: nothing to overlap with
    (2, AUTO_MIN_IMAGES, 1, 1),                # every core but the model's
    (6, 10**5, 1, 5),
    (64, 10**5, 1, MAX_AUTO_WORKERS),          # capped
    (16, 10**5, 4, 3),                         # four DDP ranks share 16 cores: 4 each, one runs the model
])
def test_default_rule(monkeypatch, cores, images, processes, expected):
    monkeypatch.setattr(workers, "usable_cores", lambda: cores)
    assert loader_workers(None, images, processes=processes) == expected


class _PidRecordingTransform:
    """``uint8 [H, W, 3] -> float [3, H, W]``; touches a file named after the process that ran it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def __call__(self, image: np.ndarray) -> torch.Tensor:
        (self.folder / str(os.getpid())).touch()
        return torch.from_numpy(np.array(image)).permute(2, 0, 1).float() / 255


def test_extraction_reads_large_sets_in_workers_with_the_same_descriptors(tmp_path, monkeypatch):
    monkeypatch.setattr(workers, "usable_cores", lambda: 2)
    paths = write_noise_images(tmp_path, AUTO_MIN_IMAGES, (8, 8, 3), seed=0, name="{i:04d}.png")
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 4))
    pids = tmp_path / "pids"
    pids.mkdir()
    default = extract_descriptors(model, paths, _PidRecordingTransform(pids), ExtractionOptions(batch_size=64))
    readers = {int(p.name) for p in pids.iterdir()}
    assert readers and os.getpid() not in readers  # read by the one worker process, not the main one
    for p in pids.iterdir():
        p.unlink()
    main_only = extract_descriptors(model, paths, _PidRecordingTransform(pids), ExtractionOptions(batch_size=64, num_workers=0))
    assert {int(p.name) for p in pids.iterdir()} == {os.getpid()}
    np.testing.assert_array_equal(default, main_only)  # same rows in the same order
