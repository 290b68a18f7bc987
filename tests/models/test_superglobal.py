"""SuperGlobal's test-time model changes (``aggzoo.models.superglobal``): which ReLUs become ReLU+, the pooling swap
of each GeM head, and what it refuses. Parity with the authors' module is a figure of the report (scratch script)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import aggzoo
from aggzoo.errors import ConfigError
from aggzoo.layers.pooling import gem, regional_gem
from aggzoo.models.features import Features
from aggzoo.models.heads.gem import GeM
from aggzoo.models.heads.gem_fc import GeMFC
from aggzoo.models.heads.gemplus import GeMPlus
from aggzoo.models.superglobal import ReLUFloor, superglobal_model


def test_relu_plus_sits_where_the_authors_put_it() -> None:
    model = aggzoo.create_model("cvnet_resnet50")
    converted = superglobal_model(model)
    resnet = converted.backbone.model
    floored = sorted(name for name, m in resnet.named_modules() if isinstance(m, ReLUFloor))
    # layer1: both bottleneck-branch ReLUs and the block output; layer2-3: the block output; layer4 and stem: none
    expected = sorted([f"layer1.{b}.{a}" for b in range(3) for a in ("act1", "act2", "act3")]
                      + [f"layer2.{b}.act3" for b in range(4)] + [f"layer3.{b}.act3" for b in range(6)])
    assert floored == expected
    assert all(m.floor == 0.014 for m in resnet.modules() if isinstance(m, ReLUFloor))
    assert not any(isinstance(m, ReLUFloor) for m in model.modules())  # the caller's model is unchanged
    ours, theirs = model.state_dict(), converted.state_dict()
    # the learned GeM exponent gives way to GeM+'s fixed one; every other tensor is the same
    assert set(theirs) - set(ours) == {"head.pool.pool.p"} and set(ours) - set(theirs) == {"head.pool.p"}
    assert theirs["head.pool.pool.p"].item() == pytest.approx(4.6)
    for key in set(ours) & set(theirs):
        torch.testing.assert_close(theirs[key], ours[key], rtol=0, atol=0)


def test_gem_fc_pools_as_superglobal_then_projects() -> None:
    torch.manual_seed(0)
    head = GeMFC(8, out_dim=5).eval()
    x = torch.rand(2, 8, 6, 7)
    swapped = head.with_superglobal_pooling()
    expected = F.normalize(head.fc(F.normalize(gem(regional_gem(x, 2.5, 5), 4.6, 1e-8), dim=-1)), dim=-1)
    torch.testing.assert_close(swapped(Features(maps=(x,))), expected)
    original = F.normalize(head.fc(gem(x, head.pool.p, 1e-6)), dim=-1)  # CVNet: no L2 before the projection
    torch.testing.assert_close(head(Features(maps=(x,))), original)
    assert swapped.min_positions == 9 and head.min_positions == 1


def test_gem_becomes_gemplus() -> None:
    assert isinstance(GeM(16).with_superglobal_pooling(), GeMPlus)


def test_heads_without_gem_and_non_resnets_are_refused() -> None:
    with pytest.raises(ConfigError, match="replaces a GeM pooling"):
        superglobal_model(aggzoo.create_model("netvlad_efficientnet_lite0"))
    with pytest.raises(ConfigError, match="ReLU\\+.*relu_floor=null"):
        superglobal_model(aggzoo.create_model("gem_efficientnet_lite0"))
    assert isinstance(superglobal_model(aggzoo.create_model("gem_efficientnet_lite0"), relu_floor=None).head, GeMPlus)


def test_gem_fc_matches_the_authors_superglobal_pooling() -> None:
    """Against a fixture made by SuperGlobal's own ``rgem`` and ``gemp`` modules (and CVNet's head FC) on a
    ``[2, 16, 7, 6]`` map (tests/convert/fixtures/superglobal_pooling.safetensors; source in its metadata)."""
    from pathlib import Path

    from safetensors import safe_open
    from safetensors.torch import load_file

    path = Path(__file__).resolve().parents[1] / "convert" / "fixtures" / "superglobal_pooling.safetensors"
    with safe_open(str(path), "pt") as file:
        assert "ShihaoShao-GH/SuperGlobal@" in file.metadata()["source"]
    tensors = load_file(str(path))
    head = GeMFC(16, out_dim=5)
    head.fc.load_state_dict({"weight": tensors["fc.weight"], "bias": tensors["fc.bias"]})
    out = head.with_superglobal_pooling().eval()(Features(maps=(tensors["x"],)))
    torch.testing.assert_close(out, tensors["expected"], rtol=0, atol=1e-6)
