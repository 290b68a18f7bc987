"""hubconf.py: torch.hub sees every registered name from a local checkout."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

import pytest
import torch
from hub_helpers import TINY_NAME, images, tiny_model
from safetensors.torch import save_file

import aggzoo
from aggzoo.hub import registry
from aggzoo.hub.cfg import PretrainedCfg

REPO = Path(__file__).resolve().parents[2]


def _hubconf():
    # What torch.hub.load(..., source="local") imports (torch.hub.list/help only take GitHub repos).
    spec = importlib.util.spec_from_file_location("hubconf", REPO / "hubconf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_hubconf_exposes_every_architecture_and_tag() -> None:
    hubconf = _hubconf()
    entries = {name for name in dir(hubconf) if callable(getattr(hubconf, name)) and not name.startswith("_")}
    assert set(aggzoo.list_models()) | set(aggzoo.list_pretrained()) <= entries
    assert hubconf.dependencies == ["torch", "timm", "safetensors"]
    doc = getattr(hubconf, "salad_dinov2_vitb14.official").__doc__
    assert "SALAD" in doc and "create_model('salad_dinov2_vitb14.official'" in doc


def test_hub_load_builds_and_loads(tiny_registered: str, isolated_dirs: dict[str, Path]) -> None:
    trained = tiny_model()
    with torch.no_grad():
        trained.head.pool.p.fill_(2.0)
    path = isolated_dirs["weights"] / "tiny.safetensors"
    save_file(dict(trained.state_dict()), str(path))
    registry.register_pretrained(f"{TINY_NAME}.hub", PretrainedCfg(
        file=path.name, sha256=hashlib.sha256(path.read_bytes()).hexdigest()))
    # hubconf.py is re-imported by torch.hub on every call, so it sees this registration.
    model = torch.hub.load(str(REPO), f"{TINY_NAME}.hub", source="local", trust_repo=True)
    trained.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(images()), trained(images()), rtol=0, atol=0)
    untrained = torch.hub.load(str(REPO), TINY_NAME, source="local", trust_repo=True, p=4.0)
    assert untrained.head.pool.p.item() == pytest.approx(4.0)
