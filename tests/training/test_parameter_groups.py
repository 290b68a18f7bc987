"""The optimiser's parameter groups read what the heads declare (no global glob such as ``head.pool.p``).

With the default ``model:`` node (no globs) the groups equal those of the old default globs
(``lr_multipliers={"head.pool.p": 10}``, ``no_weight_decay=["head.pool.p"]``) for every head that
holds a GeM (GeM, GCNet, AFA, IDA) and for NetVLAD (the default job); CosPlace's ``p``
(``head.aggregation.1.p``), which that glob missed, now trains as GeM's does.
"""

from __future__ import annotations

import functools

import pytest
import torch

from aggzoo.models.backbones.timm_backbone import TimmBackbone
from aggzoo.models.heads.afa import AFA
from aggzoo.models.heads.cosplace import CosPlace
from aggzoo.models.heads.gcnet import GCNet
from aggzoo.models.heads.gem import GeM
from aggzoo.models.heads.gemplus import GeMPlus
from aggzoo.models.heads.ida import IDA
from aggzoo.models.heads.netvlad import NetVLAD
from aggzoo.models.vpr_model import VPRModel
from aggzoo.training.module import declared_parameter_options, parameter_groups

OLD_GLOBS = {"lr_multipliers": {"head.pool.p": 10.0}, "no_weight_decay": ["head.pool.p"]}


def _model(head: type, out_indices: tuple[int, ...] = (3,)) -> VPRModel:
    torch.manual_seed(0)
    return VPRModel(TimmBackbone("test_resnet", out_indices=out_indices, frozen_stages=1), functools.partial(head))


def _membership(model: torch.nn.Module, groups: list[dict]) -> dict[str, tuple[str, float, float | None]]:
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: (g["name"], g["lr"], g.get("weight_decay")) for g in groups for p in g["params"]}


@pytest.mark.parametrize(("head", "out_indices"), [(GeM, (3,)), (GCNet, (3,)), (NetVLAD, (3,)), (GeMPlus, (3,)),
                                                    (AFA, (2, 3)), (IDA, (2, 3))])
def test_declared_groups_equal_the_old_default_globs(head: type, out_indices: tuple[int, ...]) -> None:
    model = _model(head, out_indices)
    new = parameter_groups(model, base_lr=0.1)
    old = parameter_groups(model, base_lr=0.1, **OLD_GLOBS)
    assert [(g["name"], g["lr"], g.get("weight_decay")) for g in new] == \
        [(g["name"], g["lr"], g.get("weight_decay")) for g in old]
    assert _membership(model, new) == _membership(model, old)


def test_gem_p_trains_at_ten_times_the_lr_without_weight_decay() -> None:
    model = _model(GeM)
    where = _membership(model, parameter_groups(model, base_lr=0.1))
    assert where["head.pool.p"] == ("lr_x10_no_wd", pytest.approx(1.0), 0.0)
    assert {v for k, v in where.items() if k != "head.pool.p"} == {("lr_x1", 0.1, None)}


def test_cosplace_p_is_declared_too() -> None:
    model = _model(CosPlace)
    assert declared_parameter_options(model) == ({"head.aggregation.1.p": 10.0}, {"head.aggregation.1.p"})
    where = _membership(model, parameter_groups(model, base_lr=0.1))
    assert where["head.aggregation.1.p"] == ("lr_x10_no_wd", pytest.approx(1.0), 0.0)
    assert where["head.aggregation.3.weight"] == ("lr_x1", 0.1, None)
    assert {v for k, v in where.items() if k != "head.aggregation.1.p"} == {("lr_x1", 0.1, None)}


def test_given_globs_come_before_the_declared_ones() -> None:
    model = _model(GeM)
    where = _membership(model, parameter_groups(model, base_lr=0.1, lr_multipliers={"head.*": 2.0},
                                                no_weight_decay=["backbone.*"]))
    assert where["head.pool.p"] == ("lr_x2_no_wd", 0.2, 0.0)  # the given glob wins the LR, the declaration the wd
    assert all(v[2] == 0.0 for k, v in where.items() if k.startswith("backbone."))


def test_default_job_groups_are_unchanged_and_the_model_node_is_empty(tmp_path) -> None:
    from train_helpers import compose_train

    from aggzoo.errors import ConfigError
    from aggzoo.hub.builder import build_model
    from aggzoo.run.model_by_name import model_spec
    from aggzoo.run.pipeline import module_options

    cfg = compose_train(["backbone.pretrained=false"], tmp_path)
    assert module_options(cfg) == {}  # the module's signature holds the defaults
    torch.manual_seed(0)
    model = build_model(model_spec(cfg))  # EfficientNet-Lite0 + NetVLAD
    new = parameter_groups(model, base_lr=0.1, **module_options(cfg))
    old = parameter_groups(model, base_lr=0.1, **OLD_GLOBS)
    assert [g["name"] for g in new] == ["lr_x1"]
    assert _membership(model, new) == _membership(model, old)

    changed = compose_train(["+model.head_fp32=true", "+model.lr_multipliers={backbone.*: 0.1}"], tmp_path)
    assert module_options(changed) == {"head_fp32": True, "lr_multipliers": {"backbone.*": 0.1}}
    with pytest.raises(ConfigError, match="model.head_fp23 is not an option"):
        module_options(compose_train(["+model.head_fp23=true"], tmp_path))
