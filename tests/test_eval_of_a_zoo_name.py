"""``eval.py ckpt_path=<registered name>`` evaluates that name's weights, not an untrained model of its
architecture (``create_model(name)`` alone builds it untrained: found running ``aggzoo-eval
ckpt_path=netvlad_efficientnet_lite0.synthetic``, which gave R@1 3.3 instead of the recorded 87.3)."""

from __future__ import annotations

from pathlib import Path

import torch

import aggzoo
from aggzoo.run.pipeline import model_to_evaluate

NAME = "netvlad_efficientnet_lite0.synthetic"


def test_a_registered_name_is_evaluated_with_its_weights(tmp_path: Path) -> None:
    model = model_to_evaluate(NAME, tmp_path)
    shipped = aggzoo.create_model(NAME, pretrained=True)  # the trained centroids cannot equal a random init
    for key, value in shipped.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
    assert not model.training
