"""Evaluation does not depend on the batch size or the number of loader workers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from robust_helpers import write_vg

from aggzoo.data.transforms import eval_transform
from aggzoo.data.vg import load_vg
from aggzoo.evaluation.extraction import extract_descriptors
from aggzoo.evaluation.loop import evaluate_retrieval
from aggzoo.evaluation.options import EvaluationOptions, ExtractionOptions
from aggzoo.models.vpr_model import VPRModel

CONF = Path(__file__).resolve().parents[2] / "conf"


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory):
    root = write_vg(tmp_path_factory.mktemp("vg"), "test", num_places=8, queries_per_place=2)
    torch.manual_seed(0)
    backbone = instantiate(OmegaConf.load(CONF / "backbone" / "test_resnet.yaml"))
    head = instantiate(OmegaConf.load(CONF / "head" / "gem.yaml"))
    return VPRModel(backbone, head), load_vg(root, split="test"), eval_transform((32, 32))


def test_descriptors_do_not_depend_on_workers_and_barely_on_batch_size(setup) -> None:
    model, retrieval_set, transform = setup
    paths = retrieval_set.database_paths + retrieval_set.query_paths
    out = {(bs, w): extract_descriptors(model, paths, transform, ExtractionOptions(batch_size=bs, num_workers=w))
           for bs, w in [(1, 0), (5, 0), (5, 2), (len(paths), 0)]}
    # Workers only change who reads the files: bit-identical.
    assert np.array_equal(out[5, 0], out[5, 2])
    # Batch size can change which convolution kernel oneDNN picks (single images take another
    # path), so rows may differ in the last bits (~1e-8 measured), never more.
    np.testing.assert_allclose(out[1, 0], out[len(paths), 0], rtol=0, atol=1e-6)
    np.testing.assert_allclose(out[5, 0], out[len(paths), 0], rtol=0, atol=1e-6)


def test_rankings_and_recalls_do_not_depend_on_batch_size_or_workers(setup) -> None:
    model, retrieval_set, transform = setup
    # Rankings can only differ where two database images score within ~1e-7 of each other (a
    # near-tie: an untrained NetVLAD whose descriptors all agree to 1e-4 shows it); GeM does not.
    runs = [evaluate_retrieval(model, retrieval_set, transform, EvaluationOptions(
                ks=(1, 5, 8), extraction=ExtractionOptions(batch_size=bs, num_workers=w)))
            for bs, w in [(1, 0), (5, 2), (64, 0)]]
    for run in runs[1:]:
        assert run.recalls == runs[0].recalls
        assert np.array_equal(run.predictions, runs[0].predictions)
