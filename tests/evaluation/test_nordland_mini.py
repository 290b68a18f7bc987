"""End to end on the real nordland_mini test split (skipped where the shared data, AGGZOO_SHARED_DATA or ../shared/data, is absent): the
benchmark config -> evaluate_benchmarks -> report, against an independent brute force."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from aggzoo.data.transforms import eval_transform
from aggzoo.evaluation.benchmarks import evaluate_benchmarks
from aggzoo.evaluation.options import EvaluationOptions, ExtractionOptions, OutputOptions
from aggzoo.models.backbones.timm_backbone import TimmBackbone
from aggzoo.models.heads.avgpool import AvgPool
from aggzoo.models.vpr_model import VPRModel
from aggzoo.run.benchmark_config import load_benchmark

CONFIG = Path(__file__).resolve().parents[2] / "conf" / "benchmark" / "nordland_mini.yaml"


@pytest.mark.slow  # the evaluation pipeline on the real 1292 + 1292 images
def test_nordland_mini_vg_end_to_end(nordland_mini, tmp_path):
    cfg = OmegaConf.create({"paths": {"shared_data": str(nordland_mini.parent)}, "benchmark": OmegaConf.load(CONFIG)})
    rs = load_benchmark(cfg.benchmark.nordland_mini)
    assert rs.num_queries == 1292 and rs.num_database == 1292
    assert all(len(p) == 1 for p in rs.positives)  # the same frame in the other season

    torch.manual_seed(0)
    model = VPRModel(TimmBackbone("test_resnet"), AvgPool)
    options = EvaluationOptions(extraction=ExtractionOptions(batch_size=128),
                                outputs=OutputOptions(dir=tmp_path, save_descriptors=True))
    (result,) = evaluate_benchmarks(model, {"nordland_mini": rs}, eval_transform((32, 64)), options)
    assert result.num_queries == 1292 and result.name == "nordland_mini"
    saved = np.load(tmp_path / "descriptors_nordland_mini.npz")
    db, q = saved["database"], saved["queries"]
    assert db.shape == q.shape == (1292, model.out_dim)
    # Independent reference on the same descriptors: full similarity matrix, stable order.
    order = np.argsort(-(q.astype(np.float64) @ db.astype(np.float64).T), axis=1, kind="stable")
    for k in (1, 5, 10, 20):
        expected = np.mean([rs.positives[i][0] in order[i, :k] for i in range(len(q))])
        assert abs(result.recalls[k] - expected) <= 1 / 1292  # one float32-vs-float64 near-tie at most
    report = json.loads((tmp_path / "results.json").read_text())
    assert report["results"][0]["num_queries"] == 1292
    assert (tmp_path / "recall_curves.png").stat().st_size > 0
    assert (tmp_path / "retrievals_nordland_mini.png").stat().st_size > 0
