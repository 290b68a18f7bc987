"""End to end on the real nordland_mini test split (skipped where ../shared/data is absent)."""

from __future__ import annotations

import numpy as np
import torch

from aggzoo.data.transforms import eval_transform
from aggzoo.data.vg import load_vg
from aggzoo.evaluation.retrieval import evaluate_retrieval
from aggzoo.models.backbones.timm_backbone import TimmBackbone
from aggzoo.models.heads.avgpool import AvgPool
from aggzoo.models.vpr_model import VPRModel


def test_nordland_mini_vg_end_to_end(nordland_mini):
    rs = load_vg(nordland_mini / "vg", split="test")
    assert rs.num_queries == 1292 and rs.num_database == 1292
    assert all(len(p) == 1 for p in rs.positives)  # the same frame in the other season
    torch.manual_seed(0)
    model = VPRModel(TimmBackbone("test_resnet"), AvgPool)
    transform = eval_transform((32, 64))
    result = evaluate_retrieval(model, rs, transform, batch_size=128, keep_descriptors=True)
    assert result.num_queries == 1292 and result.name == "nordland_mini_test"
    # Independent reference on the same descriptors: full similarity matrix, stable order.
    db, q = result.database_descriptors, result.query_descriptors
    assert db.shape == q.shape == (1292, model.out_dim)
    order = np.argsort(-(q.astype(np.float64) @ db.astype(np.float64).T), axis=1, kind="stable")
    for k in (1, 5, 10, 20):
        expected = np.mean([rs.positives[i][0] in order[i, :k] for i in range(len(q))])
        assert abs(result.recalls[k] - expected) <= 1 / 1292  # one float32-vs-float64 near-tie at most
