"""Compose the real ``conf/`` the way ``@hydra.main`` does, for tests that call the pipeline."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from aggzoo.run.pipeline import compose_run_config as _compose

CONF = Path(__file__).resolve().parents[1] / "conf"


def compose_run_config(name: str, overrides: list[str], out: Path) -> DictConfig:
    """``conf/<name>.yaml`` with ``overrides``, its run folder set to ``out`` (``${hydra:...}``
    resolved as in a real run, then the ``hydra`` node dropped)."""
    return _compose(CONF, name, overrides, out)
