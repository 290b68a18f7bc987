"""The image-retrieval protocol's resize (``evaluation.protocol.side=long``, ``preset=revisited``): each image's long
side shrunk to 1024 as cirtorch's ``imresize`` does (PIL's ``thumbnail``: aspect kept, never enlarged), and a query
crop scaled by its *full* image's factor (``ImagesFromList``: ``imsize * max(crop) / max(full)``), checked against
PIL's own ``thumbnail`` on real image files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from aggzoo.data.retrieval_set import ImageListDataset
from aggzoo.errors import ConfigError
from aggzoo.evaluation.protocol import EvalProtocol, long_side_size, protocol_transform


def _thumbnail_size(height: int, width: int, box: float) -> tuple[int, int]:
    image = Image.new("RGB", (width, height))
    image.thumbnail((box, box))
    return image.height, image.width


@pytest.mark.parametrize(("height", "width", "side"), [(1536, 2048, 1024), (768, 1024, 1024), (300, 200, 1024),
                                                       (2000, 999, 512), (5, 4000, 1024), (1023, 1025, 1024)])
def test_long_side_size_is_pils_thumbnail(height: int, width: int, side: int) -> None:
    expected = _thumbnail_size(height, width, side)
    assert long_side_size(height, width, side) == expected
    if max(height, width) <= side:  # never enlarged
        assert expected == (height, width)
    else:
        assert max(expected) <= side


def test_the_transform_shrinks_the_long_side_and_never_enlarges() -> None:
    transform = protocol_transform(long_side=1024)
    big = np.zeros((1536, 2048, 3), np.uint8)
    small = np.zeros((120, 160, 3), np.uint8)
    assert tuple(transform(big).shape) == (3, 768, 1024)
    assert tuple(transform(small).shape) == (3, 120, 160)


def test_a_query_crop_is_scaled_by_its_full_images_factor(tmp_path: Path) -> None:
    """A 2048 x 1536 photo shrunk to 1024 is halved; its 400 x 300 box must be halved too (200 x 150), not blown up
    to a 1024 long side."""
    rng = np.random.default_rng(0)
    path = tmp_path / "query.png"
    Image.fromarray(rng.integers(0, 256, (1536, 2048, 3), dtype=np.uint8)).save(path)
    box = (100.0, 200.0, 500.0, 500.0)  # x1, y1, x2, y2: 400 wide, 300 high
    dataset = ImageListDataset([path, path], protocol_transform(long_side=1024), boxes=[box, None])
    cropped, _ = dataset[0]
    whole, _ = dataset[1]
    assert tuple(cropped.shape[1:]) == _thumbnail_size(300, 400, 1024 * 400 / 2048) == (150, 200)
    assert tuple(whole.shape[1:]) == (768, 1024)
    # a fixed-size transform ignores where a crop came from
    fixed = ImageListDataset([path], protocol_transform((64, 64)), boxes=[box])
    assert tuple(fixed[0][0].shape[1:]) == (64, 64)


def test_the_protocol_states_its_side() -> None:
    protocol = EvalProtocol(image_size=1024, side="long", resize="protocol", interpolation="lanczos")
    assert protocol.output_size(1536, 2048) == (768, 1024)
    assert protocol.describe().startswith("long side 1024")
    assert protocol.to_dict()["side"] == "long" and protocol.to_dict()["short_side"] is False
    assert EvalProtocol(image_size=322, resize="protocol").output_size(480, 640) == (322, 429)
    with pytest.raises(ConfigError, match="evaluation.protocol.side='wide'"):
        EvalProtocol(image_size=1024, side="wide", resize="protocol")


@pytest.mark.slow
def test_eval_py_with_the_revisited_preset(tmp_path: Path) -> None:
    """``preset=revisited`` on a revisitop folder: the recorded protocol is the long side 1024 at three scales."""
    from revisitop_files import write_revisitop
    from robustness.entry_helpers import run_entry

    root = write_revisitop(tmp_path / "roxford5k")
    out = tmp_path / "run"
    result = run_entry(["model=netvlad_efficientnet_lite0.synthetic", "benchmark=roxford5k",
                        f"benchmark.roxford5k.root={root}", "preset=revisited", "evaluation.outputs.pictures=false",
                        f"hydra.run.dir={out}"], tmp_path, script="eval.py")
    assert result.returncode == 0, result.stderr[-3000:]
    meta = json.loads((out / "results.json").read_text())["meta"]
    assert meta["protocol"]["side"] == "long" and meta["protocol"]["image_size"] == 1024
    assert meta["settings"]["scales"] == [1.0, 0.7071, 0.5]
    assert "medium/mAP" in json.loads((out / "results.json").read_text())["results"][0]["metrics"]
