"""Extraction options of issue 12 item 6: ``evaluation.precision`` (autocast) and ``channels_last``.
A tiny real conv net on tiny real PNG files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from image_files import write_noise_images

from aggzoo.data.retrieval_set import RetrievalSet
from aggzoo.errors import ConfigError, UserError
from aggzoo.evaluation.benchmarks import evaluate_benchmarks
from aggzoo.evaluation.extraction import extract_descriptors
from aggzoo.evaluation.options import (
    PRECISIONS,
    EvaluationOptions,
    ExtractionOptions,
    OutputOptions,
    autocast_dtype_of,
)


class _TinyConvNet(torch.nn.Module):
    """``[B, 3, H, W] -> [B, 16]``: conv, ReLU, spatial mean, L2 (autocast runs the conv in bf16/fp16)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.normalize(self.conv(x).relu().mean(dim=(2, 3)).float(), dim=1)


def _to_tensor(image: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(image.transpose(2, 0, 1).astype(np.float32) / 255.0)


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return write_noise_images(tmp_path_factory.mktemp("images"), 24, (12, 16, 3), seed=0, name="{i:02d}.png")


def test_channels_last_gives_the_same_descriptors_and_leaves_the_model_contiguous(images: list[Path]) -> None:
    model = _TinyConvNet()
    plain = extract_descriptors(model, images, _to_tensor, ExtractionOptions(batch_size=8))
    fast = extract_descriptors(model, images, _to_tensor, ExtractionOptions(batch_size=8, channels_last=True))
    np.testing.assert_allclose(fast, plain, atol=1e-6)
    assert model.conv.weight.is_contiguous()


def test_bf16_autocast_runs_the_model_in_bf16_and_stays_close_to_fp32(images: list[Path]) -> None:
    model = _TinyConvNet()
    fp32 = extract_descriptors(model, images, _to_tensor, ExtractionOptions(batch_size=8))
    bf16_options = ExtractionOptions(batch_size=8, precision="bf16")
    assert bf16_options.autocast_dtype is autocast_dtype_of("bf16") is torch.bfloat16
    bf16 = extract_descriptors(model, images, _to_tensor, bf16_options)
    assert bf16.dtype == np.float32 and not np.array_equal(bf16, fp32)  # the conv really ran in bf16 ...
    cosine = (bf16 * fp32).sum(axis=1)  # both unit rows
    assert cosine.min() > 0.999  # ... within bf16's 8-bit mantissa of fp32
    assert autocast_dtype_of("fp32") is None and set(PRECISIONS) == {"fp32", "bf16", "fp16"}


def test_evaluation_precision_reaches_the_results_and_a_bad_value_is_a_user_error(
        images: list[Path], tmp_path: Path) -> None:
    rs = RetrievalSet("tiny", tuple(images[:16]), tuple(images[16:]),
                      tuple(np.array([i], np.int64) for i in range(8)))
    options = EvaluationOptions(ks=(1,), extraction=ExtractionOptions(precision="bf16"),
                                outputs=OutputOptions(dir=tmp_path, pictures=False))
    evaluate_benchmarks(_TinyConvNet(), [rs], _to_tensor, options)
    settings = json.loads((tmp_path / "results.json").read_text())["meta"]["settings"]
    assert settings["precision"] == "bf16"
    with pytest.raises(ConfigError, match=r"evaluation.extraction.precision='fp64'.*fp32, bf16, fp16") as error:
        ExtractionOptions(precision="fp64")  # refused when the options are made, before any image is read
    assert isinstance(error.value, UserError)
