"""Class-balanced batches (P classes x m images) from a ClassLabelledImages: m images of one class per item,
dense labels, a pure function of (seed, epoch), mid-epoch resume; the synthetic landmark ids read back as the
ground truth of the generated set says."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from aggzoo.data.class_batches import ClassImagesDataset
from aggzoo.data.class_labelled import ClassLabelledImages
from aggzoo.errors import DatasetLayoutError
from aggzoo.training.samplers import EpochKeyedDataset, PlaceBatchSampler, ResumableDataLoader

#: source class id -> number of images (class 9 has one image: left out at m = 2)
COUNTS = {7: 5, 3: 2, 12: 4, 5: 3, 9: 1, 20: 6, 14: 2}


def _raw(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(array.copy()).permute(2, 0, 1).float()


@pytest.fixture
def images(tmp_path: Path) -> ClassLabelledImages:
    """Solid-colour PNGs whose red channel is the image's number and green its source class id."""
    paths, labels, number = [], [], 0
    for class_id, count in COUNTS.items():
        for _ in range(count):
            path = tmp_path / f"img{number:03d}.png"
            Image.fromarray(np.full((4, 4, 3), (number, class_id, 0), dtype=np.uint8)).save(path)
            paths.append(path)
            labels.append(class_id)
            number += 1
    return ClassLabelledImages("toy", tuple(paths), np.array(labels))


def _dataset(images: ClassLabelledImages, m: int = 2, seed: int = 0) -> ClassImagesDataset:
    return ClassImagesDataset(images, img_per_class=m, transform=_raw, seed=seed)


def _loader(dataset: ClassImagesDataset, p: int, seed: int = 0, epoch: int = 0) -> ResumableDataLoader:
    sampler = PlaceBatchSampler(len(dataset), places_per_batch=p, seed=seed)
    sampler.set_epoch(epoch)
    return ResumableDataLoader(EpochKeyedDataset(dataset, seed=seed), batch_size=sampler.local_places, sampler=sampler,
                               generator=torch.Generator().manual_seed(seed))


def test_dense_labels_and_the_classes_kept(images: ClassLabelledImages) -> None:
    dataset = _dataset(images, m=2)
    kept = sorted(c for c, n in COUNTS.items() if n >= 2)
    assert dataset.class_ids.tolist() == kept and dataset.num_classes == len(kept) == len(dataset)
    assert dataset.place_ids.tolist() == list(range(len(kept)))
    assert dataset.num_images == sum(n for n in COUNTS.values() if n >= 2)
    # m = 4: only the classes with at least 4 images
    assert _dataset(images, m=4).class_ids.tolist() == sorted(c for c, n in COUNTS.items() if n >= 4)
    with pytest.raises(DatasetLayoutError, match="no class of toy has at least 7 images"):
        _dataset(images, m=7)


@pytest.mark.parametrize("m", [2, 3])
def test_every_batch_holds_m_distinct_images_of_each_of_p_distinct_classes(images: ClassLabelledImages, m: int) -> None:
    dataset = _dataset(images, m=m)
    p = 2
    by_number = {i: int(c) for i, c in enumerate(images.labels)}  # image number -> its source class
    batches = list(_loader(dataset, p))
    assert len(batches) == len(dataset) // p
    seen_classes = []
    for pixels, labels in batches:
        assert pixels.shape == (p, m, 3, 4, 4) and labels.shape == (p, m)
        for row_pixels, row_labels in zip(pixels, labels, strict=True):
            assert len(set(row_labels.tolist())) == 1  # one class per item
            label = int(row_labels[0])
            numbers = [int(img[0, 0, 0]) for img in row_pixels]
            sources = {int(img[1, 0, 0]) for img in row_pixels}
            assert len(set(numbers)) == m  # m different images
            assert sources == {int(dataset.class_ids[label])} == {by_number[n] for n in numbers}
            seen_classes.append(label)
    assert len(seen_classes) == len(set(seen_classes))  # a class at most once per epoch


def test_epochs_are_pure_functions_of_seed_and_epoch(images: ClassLabelledImages) -> None:
    def epoch_pixels(seed: int, epoch: int) -> list[torch.Tensor]:
        return [b[0] for b in _loader(_dataset(images, seed=seed), 2, seed=seed, epoch=epoch)]

    first = epoch_pixels(0, 3)
    assert all(torch.equal(a, b) for a, b in zip(first, epoch_pixels(0, 3), strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(first, epoch_pixels(0, 4), strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(first, epoch_pixels(1, 3), strict=True))


def test_a_loader_resumed_mid_epoch_gives_the_remaining_batches(images: ClassLabelledImages) -> None:
    dataset = _dataset(images)
    full = [b[0] for b in _loader(dataset, 2, epoch=1)]
    run = _loader(dataset, 2, epoch=1)
    for _ in run:  # the training module counts every consumed batch
        run.sampler.mark_batch_started(len(full))
        break
    state = run.state_dict()
    resumed = _loader(_dataset(images), 2)
    resumed.load_state_dict(state)
    rest = [b[0] for b in resumed]
    assert len(rest) == len(full) - 1 and all(torch.equal(a, b) for a, b in zip(rest, full[1:], strict=True))


def test_missing_files_name_the_set(images: ClassLabelledImages) -> None:
    images.paths[0].unlink()
    with pytest.raises(DatasetLayoutError, match=r"1 images of toy do not exist, e\.g\.:\n  .*img000\.png"):
        _dataset(images)


def test_synthetic_landmark_ids_follow_the_generated_ground_truth(tmp_path: Path) -> None:
    from aggzoo.data.synthetic_landmarks import (
        GND_FILE,
        SyntheticLandmarksConfig,
        generate_synthetic_landmarks,
        read_synthetic_landmark_ids,
    )

    config = SyntheticLandmarksConfig(seed=3, landmarks=2, queries_per_landmark=1, easy_per_landmark=2,
                                      hard_per_landmark=1, junk_per_landmark=1, lookalikes_per_landmark=1,
                                      street_scenes=2, image_size=(64, 48))
    root = generate_synthetic_landmarks(tmp_path / "set", config, workers=1)
    read = read_synthetic_landmark_ids(root)
    with open(root / GND_FILE, "rb") as fh:
        gnd = pickle.load(fh)
    # Every database image once, none of the queries.
    assert sorted(p.stem for p in read.paths) == sorted(gnd["imlist"])
    by_class = {c: sorted(read.paths[i].stem for i in idx) for c, idx in read.indices_by_class().items()}
    # A landmark's class holds exactly the easy, hard and junk photographs of its queries (the landmark ids
    # come first: 0 .. landmarks-1); the look-alikes and street scenes are classes of two photographs each.
    for query in gnd["gnd"]:
        members = sorted(gnd["imlist"][i] for i in query["easy"] + query["hard"] + query["junk"])
        assert members in [by_class[c] for c in range(config.landmarks)]
    distractors = [c for c in by_class if c >= config.landmarks]
    assert len(distractors) == config.landmarks * config.lookalikes_per_landmark + config.street_scenes
    assert all(len(by_class[c]) == 2 for c in distractors)
    dataset = ClassImagesDataset(read, img_per_class=2)
    assert dataset.num_classes == len(by_class)


def test_a_missing_landmark_ids_file_is_one_clear_error(tmp_path: Path) -> None:
    from aggzoo.data.synthetic_landmarks import read_synthetic_landmark_ids

    with pytest.raises(DatasetLayoutError, match=r"landmark_ids\.csv not found; expected a synthetic landmark set"):
        read_synthetic_landmark_ids(tmp_path)
