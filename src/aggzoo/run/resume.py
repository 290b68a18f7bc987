"""``ckpt_path=last`` (or a run folder) resumes a run with the run's own config.

A resumed run is the same run: ``python train.py head=gem data.places_per_batch=6`` then
``python train.py ckpt_path=last`` continues with GeM and 6 places per batch, without the user
repeating the overrides. Hydra saved the run's command-line overrides in
``<run>/.hydra/overrides.yaml`` and its composed config in ``<run>/.hydra/config.yaml``;
:func:`resume_config` composes the config again from *aggzoo's own* ``conf/`` with those overrides
replayed, then this command's overrides on top.

Trust boundary: the saved files are read as plain YAML (data, no code) and their config is never
instantiated. Replaying an override only picks one of aggzoo's config files (``head=gem``) or sets a
value (``data.image_size=[32,48]``); an override that names code (a ``_target_``, ``_partial_``...
key, or a value holding one, with the rest of that node: ``+callbacks.crash._target_=...``) is not
replayed but named in a warning, to be passed again if the run needs it. The model is then built
from the composed ``backbone`` / ``head`` nodes by the one builder (``run.pipeline.model_spec`` ->
``hub.builder``), and the composed config is type-checked by ``run.config_schema`` as any other.

An override given anyway must agree with the saved config (a resume cannot change what the run
is): one that differs stops with one :class:`~aggzoo.errors.ConfigError` naming the key and both
values. Where and how to resume (``ckpt_path``, ``paths.*``, ``hydra.*``) are free. A run folder
without ``.hydra/`` (a config composed in Python) resumes with the config given, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import OverrideParseException
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from aggzoo.errors import ConfigError

__all__ = ["SAVED_CONFIG", "SAVED_OVERRIDES", "current_overrides", "resume_config", "saved_overrides"]

log = logging.getLogger(__name__)

SAVED_CONFIG = Path(".hydra") / "config.yaml"
SAVED_OVERRIDES = Path(".hydra") / "overrides.yaml"
_ABSENT = object()


def _key(line: str) -> str:
    """``+callbacks.x.step=6`` -> ``callbacks.x.step``; ``benchmark@test_benchmarks=[a]`` -> ``test_benchmarks``."""
    override = OverridesParser.create().parse_override(line)
    return override.package if override.package else override.key_or_group


def _free(key: str) -> bool:
    # Where and how to resume, not what the run is: this command's settings win.
    return key in ("ckpt_path", "paths", "hydra") or key.startswith(("paths.", "hydra."))


def _names_code(value: Any) -> bool:
    if isinstance(value, dict):
        return any(str(k).startswith("_") or _names_code(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_names_code(v) for v in value)
    return False


def _screen(lines: Sequence[str]) -> tuple[list[str], list[str]]:
    """Saved overrides -> (replayed, not replayed because they name code)."""
    parser = OverridesParser.create()
    parsed = [(line, parser.parse_override(line)) for line in lines]
    code_nodes = set()
    for line, override in parsed:
        key = _key(line)
        parts = key.split(".")
        if any(p.startswith("_") for p in parts):
            code_nodes.add(".".join(parts[:next(i for i, p in enumerate(parts) if p.startswith("_"))]))
        elif not override.is_delete() and _names_code(override.value()):
            code_nodes.add(key)
    replayed, dropped = [], []
    for line, _ in parsed:
        key = _key(line)
        if _free(key):
            continue
        names_code = any(p.startswith("_") for p in key.split("."))
        if names_code or any(key == node or key.startswith(node + ".") for node in code_nodes if node):
            dropped.append(line)
        else:
            replayed.append(line)
    return replayed, dropped


def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=False) if isinstance(node, (DictConfig, ListConfig)) else node


def _short(value: Any) -> str:
    text = "absent" if value is _ABSENT else repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def saved_overrides(run_dir: Path) -> list[str] | None:
    """The command-line overrides Hydra recorded for the run in ``run_dir`` (``None``: not recorded)."""
    path = Path(run_dir) / SAVED_OVERRIDES
    if not path.is_file():
        return None
    lines = OmegaConf.load(path)  # plain YAML: a list of strings
    if not isinstance(lines, ListConfig) or not all(isinstance(x, str) for x in lines):
        raise ConfigError(f"{path} is not a list of overrides as Hydra writes it; resume with ckpt_path=<the .ckpt "
                          "file> and the run's overrides, or restore the file")
    return list(lines)


def current_overrides() -> list[str]:
    """This command's overrides (Hydra's record of the running job; empty outside Hydra)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return []
    return list(HydraConfig.get().overrides.task)


def resume_config(cfg: DictConfig, run_dir: Path, *, overrides: Sequence[str] | None = None) -> DictConfig:
    """``cfg`` (this command's config, ``paths.output_dir`` already the resumed run's folder) as the
    run in ``run_dir`` was configured: composed from aggzoo's ``conf/`` with the run's saved overrides
    and ``overrides`` (default: this command's). Returns ``cfg`` itself when the run saved no config.

    Raises:
        ConfigError: an override given now differs from the run's saved config (naming the key).
    """
    saved_lines = saved_overrides(run_dir)
    saved_path = Path(run_dir) / SAVED_CONFIG
    if saved_lines is None or not saved_path.is_file():
        return cfg
    saved = OmegaConf.load(saved_path)  # compared with, never instantiated
    given = list(current_overrides() if overrides is None else overrides)
    effective = {_key(line): line for line in given}  # the last override of a key is the one in effect
    for key, line in effective.items():
        if _free(key):
            continue
        before = _plain(OmegaConf.select(saved, key, default=_ABSENT, throw_on_missing=False))
        now = _plain(OmegaConf.select(cfg, key, default=_ABSENT, throw_on_missing=False))
        if before != now:
            raise ConfigError(
                f"ckpt_path={cfg.get('ckpt_path')} resumes {run_dir} with its own saved config ({saved_path}), but "
                f"the override {line} differs from it: {key} is {_short(before)} there, {_short(now)} now. Drop the "
                "override (the run's own settings need not be repeated), or start a new run without ckpt_path")
    try:
        replayed, dropped = _screen(saved_lines)
    except OverrideParseException as err:
        raise ConfigError(f"{Path(run_dir) / SAVED_OVERRIDES} holds an override Hydra cannot parse ({err}); restore "
                          "the file, or resume with ckpt_path=<the .ckpt file> and the run's overrides") from None
    if dropped:
        log.warning("resuming %s: not replaying %s from %s (it names code to run; nothing read from a file chooses "
                    "code); pass it again if the run needs it", run_dir, " ".join(dropped), run_dir / SAVED_OVERRIDES)
    replayed_keys = {_key(line) for line in replayed}
    composed = _compose([*replayed, *(line for line in given if _key(line) not in replayed_keys)])
    with open_dict(composed):
        composed.paths = cfg.paths  # where things are: this command's (and the resumed folder)
        composed.ckpt_path = cfg.get("ckpt_path")
    log.info("resuming with the config of %s (overrides %s)", run_dir, " ".join(replayed) or "none")
    return composed


def _compose(overrides: list[str]) -> DictConfig:
    """Compose the running job's primary config (``train``) from aggzoo's conf/ with ``overrides``:
    in the job's Hydra context (``train.py``), or in one made on the job's own config folder (a
    config composed in Python, :func:`aggzoo.run.pipeline.compose_run_config`)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        raise ConfigError("resuming a run with its saved config needs the job's Hydra context (python train.py "
                          "ckpt_path=..., or aggzoo.run.pipeline.compose_run_config)")
    job = HydraConfig.get()
    name = job.job.config_name or "train"
    if GlobalHydra.instance().is_initialized():
        return compose(name, overrides=overrides)
    main = next((s for s in job.runtime.config_sources if s.provider == "main" and s.schema == "file"), None)
    if main is None:
        raise ConfigError("resuming a run with its saved config: the job's config folder is not known; compose the "
                          "config with aggzoo.run.pipeline.compose_run_config")
    with initialize_config_dir(str(main.path), version_base="1.3"):
        return compose(name, overrides=overrides)
