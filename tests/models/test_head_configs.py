"""``conf/head/*.yaml`` and the zoo's head specs state only what differs from the class defaults.

The class defaults are the paper configuration (``Head`` subclasses' keyword-only arguments); a YAML
file or a ``head(Cls, **kwargs)`` spec in ``src/aggzoo/zoo`` names only the arguments it changes, so
a default lives in one place. A YAML key may repeat its default on purpose when its line says so
with a ``# default, stated: <why>`` comment (MixVPR's map size, which every user has to match to
their backbone, stays visible and overridable as ``head.in_h=...``); it must then equal the default.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hydra.utils import instantiate
from omegaconf import OmegaConf

import aggzoo.zoo
import aggzoo.zoo._backbones as zoo_backbones
from aggzoo.hub import registry
from aggzoo.models.heads.base import Head

HEAD_CONFIGS = sorted((Path(__file__).resolve().parents[2] / "conf" / "head").glob("*.yaml"))
STATED = "# default, stated:"


def _class(target: str) -> type:
    module, _, name = target.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _defaults(cls: type) -> dict[str, Any]:
    params = inspect.signature(cls.__init__).parameters
    return {k: p.default for k, p in params.items() if p.default is not inspect.Parameter.empty}


def _same(a: Any, b: Any) -> bool:
    """Equal values (``3 == 3.0``), but ``True`` is not ``1``."""
    return a == b and isinstance(a, bool) == isinstance(b, bool)


@pytest.mark.parametrize("path", HEAD_CONFIGS, ids=[p.stem for p in HEAD_CONFIGS])
def test_yaml_states_only_what_differs_from_the_class_defaults(path: Path) -> None:
    cfg = yaml.safe_load(path.read_text())
    cls = _class(cfg["_target_"])
    defaults = _defaults(cls)
    stated = {m.group(1) for m in re.finditer(rf"^(\w+):.*{re.escape(STATED)}", path.read_text(), re.M)}
    for key, value in cfg.items():
        if key.startswith("_"):
            continue
        assert key in defaults, f"{path.name}: {key!r} is not a keyword argument with a default of {cls.__name__}"
        if key in stated:
            assert _same(value, defaults[key]), f"{path.name}: {key}={value!r} is marked as the default " \
                                                f"but {cls.__name__}'s default is {defaults[key]!r}"
        else:
            assert not _same(value, defaults[key]), (
                f"{path.name}: {key}={value!r} repeats {cls.__name__}'s default; drop it (the class defaults are "
                f"the paper configuration) or mark the line '{STATED} <why>'")


@pytest.mark.parametrize("path", HEAD_CONFIGS, ids=[p.stem for p in HEAD_CONFIGS])
def test_yaml_name_starts_with_its_head_module(path: Path) -> None:
    target = yaml.safe_load(path.read_text())["_target_"]
    module = target.rpartition(".")[0]
    assert module.startswith("aggzoo.models.heads."), target
    stem = module.rpartition(".")[2]
    assert path.stem.startswith(stem), f"{path.name} builds {target}: name it {stem}.yaml or {stem}<variant>.yaml"
    assert issubclass(_class(target), Head)


@pytest.mark.parametrize("path", HEAD_CONFIGS, ids=[p.stem for p in HEAD_CONFIGS])
def test_yaml_matches_its_class_signature(path: Path) -> None:
    """Every YAML, also one that holds no keys: a partial of an aggzoo ``Head`` whose only missing argument
    is ``in_channels`` (completed in code from the backbone), every other argument keyword-only and either
    stated in the YAML or defaulted by the class; Hydra builds exactly that partial."""
    cfg = yaml.safe_load(path.read_text())
    assert cfg.get("_partial_") is True, f"{path.name}: needs '_partial_: true' (in_channels comes from the backbone)"
    cls = _class(cfg["_target_"])
    assert isinstance(cls, type) and issubclass(cls, Head) and cls.__module__.startswith("aggzoo.models.heads."), \
        f"{path.name}: _target_ {cfg['_target_']} is not a Head of aggzoo.models.heads"
    first, *others = inspect.signature(cls).parameters.values()
    assert first.name == "in_channels" and first.default is inspect.Parameter.empty, \
        f"{path.name}: {cls.__name__}'s first argument is {first.name!r}, not in_channels"
    not_keyword_only = [p.name for p in others if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    assert not not_keyword_only, f"{cls.__name__}: hyperparameters must be keyword-only: {not_keyword_only}"
    stated = {k: v for k, v in cfg.items() if not k.startswith("_")}
    unknown = sorted(set(stated) - {p.name for p in others})
    assert not unknown, f"{path.name}: {unknown} are not keyword arguments of {cls.__name__}"
    unset = [p.name for p in others if p.default is inspect.Parameter.empty and p.name not in stated]
    assert not unset, f"{path.name}: {cls.__name__} has no default for {unset}; the YAML must state them"
    built = instantiate(OmegaConf.create(cfg))
    assert isinstance(built, functools.partial) and built.func is cls and not built.args, \
        f"{path.name}: Hydra built {built!r}, not a partial of {cls.__name__}"
    assert OmegaConf.to_container(OmegaConf.create(dict(built.keywords))) == stated, \
        f"{path.name}: Hydra passes {dict(built.keywords)} to {cls.__name__}, the YAML states {stated}"


def _registered_head_specs(monkeypatch: pytest.MonkeyPatch) -> dict[str, dict[str, Any]]:
    monkeypatch.setattr(zoo_backbones, "build_model", lambda spec: spec)  # vpr() returns its spec
    aggzoo.zoo.import_method_files()
    entries = {name: registry.model_entrypoint(name) for name in registry.list_models()}
    # only the zoo's own entry points (tests may register stand-ins of their own)
    return {name: fn()["head"] for name, fn in entries.items() if fn.__module__.startswith("aggzoo.zoo.")}


def test_zoo_head_specs_state_only_what_differs(monkeypatch: pytest.MonkeyPatch) -> None:
    specs = _registered_head_specs(monkeypatch)
    assert specs
    for name, spec in specs.items():
        cls = _class(spec["_target_"])
        defaults = _defaults(cls)
        for key, value in spec.items():
            if key == "_target_":
                continue
            assert key in defaults, f"{name}: {key!r} is not a keyword argument of {cls.__name__}"
            assert not _same(value, defaults[key]), f"{name}: head({cls.__name__}, {key}={value!r}) repeats the default"
