"""DELG's ImageNet-style crop (aggzoo.data.transforms.inception_crop): a crop inside the image with the area
and aspect ratio it is given, resized to the output size; reproducible through the seed the training items get."""

from __future__ import annotations

import cv2
import numpy as np
import torch

from aggzoo.data.transforms import inception_crop
from aggzoo.training.samplers import seed_transform


def _coordinates(height: int, width: int) -> np.ndarray:
    """An image whose red channel is the column and green channel the row of each pixel."""
    rows, cols = np.mgrid[0:height, 0:width]
    return np.stack([cols, rows, np.zeros_like(rows)], axis=-1).astype(np.uint8)




def test_whole_image_scale_and_ratio_is_a_plain_area_resize() -> None:
    image = _coordinates(60, 80)
    crop = inception_crop((30, 40), mean=(0, 0, 0), std=(1, 1, 1), scale=(1.0, 1.0), ratio=(80 / 60, 80 / 60))
    expected = cv2.resize(image, (40, 30), interpolation=cv2.INTER_AREA).astype(np.float32) / 255.0
    torch.testing.assert_close(crop(image), torch.from_numpy(expected.transpose(2, 0, 1)), atol=1 / 255, rtol=0)


def test_crops_keep_their_area_and_aspect_bounds() -> None:
    image = _coordinates(120, 160)
    crop = inception_crop((32, 32), mean=(0, 0, 0), std=(1 / 255, 1 / 255, 1 / 255), interpolation="nearest")
    areas, ratios = [], []
    for seed in range(40):
        seed_transform(crop, seed)
        out = crop(image).numpy()  # [3, 32, 32] pixel values: the source columns and rows
        cols, rows = out[0], out[1]
        width, height = cols.max() - cols.min() + 1, rows.max() - rows.min() + 1
        areas.append(width * height / (120 * 160))
        ratios.append(width / height)
    # nearest sampling of a 32 x 32 grid sees the crop's extent to within a source pixel per 32
    assert min(areas) >= 0.1 * 0.9 and max(areas) <= 1.0
    assert min(ratios) >= 0.75 * 0.9 and max(ratios) <= 4 / 3 * 1.1
    assert max(areas) - min(areas) > 0.3  # the area really varies


def test_the_same_seed_gives_the_same_crop() -> None:
    image = _coordinates(120, 160)
    crop = inception_crop((32, 32))
    seed_transform(crop, 7)
    first = crop(image)
    seed_transform(crop, 7)
    assert torch.equal(first, crop(image))
    seed_transform(crop, 8)
    assert not torch.equal(first, crop(image))
