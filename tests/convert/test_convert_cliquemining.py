"""SALAD-CM (serizba/cliquemining): the released file is a Lightning checkpoint whose ``state_dict``
holds serizba/salad's keys; through SALAD's converter every tensor lands where SALAD's would."""

from __future__ import annotations

from pathlib import Path

import torch
from official_layouts import assert_placed, dinov2_hub, fill, prefixed, salad_aggregator, save

import aggzoo
from aggzoo.hub import registry

DEPTH = 2
SMALL_VIT = {"depth": DEPTH, "frozen_stages": 0}


def test_cliquemining_lightning_checkpoint_loads_through_the_salad_converter(tmp_path: Path) -> None:
    upstream = fill(prefixed("backbone.model.", dinov2_hub(DEPTH)) + salad_aggregator("aggregator.", cluster_dim=128))
    lightning = {"epoch": 3, "global_step": 8000, "pytorch-lightning_version": "2.1.0", "state_dict": upstream,
                 "optimizer_states": [{"state": {}, "param_groups": [{"lr": 6e-5}]}], "lr_schedulers": [{}],
                 "callbacks": {}, "hyper_parameters": {"agg_arch": "SALAD", "lr": 6e-5}}
    path = save(lightning, tmp_path / "cliquemining.ckpt")
    model = aggzoo.create_model("salad_dinov2_vitb14.cliquemining", checkpoint_path=path, backbone_kwargs=SMALL_VIT)
    mapping = {k: None if k.endswith("mask_token") else k.replace("aggregator.", "head.") for k in upstream}
    assert_placed(model, upstream, mapping, {"backbone.model.pos_embed": upstream["backbone.model.pos_embed"]})
    assert model.out_dim == 8448
    cfg = registry.get_pretrained_cfg("salad_dinov2_vitb14.cliquemining")
    assert cfg.remap is registry.get_pretrained_cfg("salad_dinov2_vitb14.official").remap
    assert "1B06ysb-Wjb4KDcNrl-7pyj1mJve1jqdk" in cfg.download_page
    with torch.no_grad():
        assert model.eval()(torch.randn(1, 3, 126, 126)).shape == (1, 8448)  # 9 x 9 patches > 64 clusters
