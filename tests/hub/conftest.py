"""Fixtures for the hub tests: a tiny registered architecture and isolated weights/cache folders."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import huggingface_hub.constants as hf_constants
import pytest
from hub_helpers import TINY_NAME, tiny_model
from hub_servers import LocalHub

import aggzoo.hub.factory  # noqa: F401  (imports the zoo and the shipped manifest)
from aggzoo.hub import registry

# The factory import above fills the registry (zoo + the real weights/manifest.json) before any test
# points AGGZOO_WEIGHTS_DIR elsewhere, so the shipped tags are registered whatever the test order.


@pytest.fixture
def tiny_registered() -> Iterator[str]:
    """Register ``gem_testresnet`` for one test, then remove it (and any tags the test added)."""
    registry.register_model(tiny_model)
    try:
        yield TINY_NAME
    finally:
        registry._ENTRYPOINTS.pop(TINY_NAME, None)
        registry._PRETRAINED.pop(TINY_NAME, None)


@pytest.fixture
def isolated_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """An empty weights folder and download cache for one test, and no network."""
    weights, cache = tmp_path / "weights", tmp_path / "cache"
    weights.mkdir()
    cache.mkdir()
    monkeypatch.setenv("AGGZOO_WEIGHTS_DIR", str(weights))
    monkeypatch.setenv("AGGZOO_CACHE", str(cache))
    monkeypatch.setenv("AGGZOO_OFFLINE", "1")
    return {"weights": weights, "cache": cache}


@pytest.fixture
def online(isolated_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """The isolated folders, with the network allowed (it only reaches 127.0.0.1 here)."""
    monkeypatch.delenv("AGGZOO_OFFLINE")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return isolated_dirs


@pytest.fixture
def local_hub(online: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalHub]:
    """A local Hugging Face-style endpoint, installed as ``HF_ENDPOINT=<url>`` does (huggingface_hub
    reads that variable once, at import, into these two constants), and an empty Hugging Face cache."""
    hub_server = LocalHub(token="hf_test_token")
    with hub_server.serve() as url:
        monkeypatch.setattr(hf_constants, "ENDPOINT", url)
        monkeypatch.setattr(hf_constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")
        monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hf_cache"))
        yield hub_server
