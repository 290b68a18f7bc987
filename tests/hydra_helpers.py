"""Compose the real ``conf/`` the way ``@hydra.main`` does, for tests that call the pipeline."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

CONF = Path(__file__).resolve().parents[1] / "conf"


def compose_run_config(name: str, overrides: list[str], out: Path) -> DictConfig:
    """``conf/<name>.yaml`` with ``overrides``, its run folder set to ``out`` (``${hydra:...}``
    resolved as in a real run, then the ``hydra`` node dropped)."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose(name, overrides=overrides, return_hydra_config=True)
    HydraConfig().set_config(cfg)
    with open_dict(cfg):
        cfg.paths.output_dir = str(out)
        cfg.paths.root_dir = str(CONF.parent)
        del cfg.hydra
    return cfg
