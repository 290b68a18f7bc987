"""Shared fixtures: paths, seeds and tiny backbones."""

from __future__ import annotations

import dis
import inspect
import os
import sys
import types
from pathlib import Path

import pytest
from shared_paths import ENV, NORDLAND_MINI

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def nordland_mini() -> Path:
    if not (NORDLAND_MINI / "vg").is_dir():
        pytest.skip(f"real test data not found at {NORDLAND_MINI} (beside the team's checkout, or set {ENV})")
    return NORDLAND_MINI


# -- the fast lane: `pytest -m "not slow"` ---------------------------------------------------------------
#
# A test is marked `slow` when it, a fixture it uses, or a helper either of them calls (followed through
# the functions and classes defined under tests/) refers to something that starts a process, fits a model
# or runs a pipeline. So a new test is in the right lane the moment it calls `run_entry`, `train_py`,
# `tiny_trainer`, `pipeline.train`, ..., without a marker of its own. A test that is slow for another
# reason carries `@pytest.mark.slow` itself.

#: modules whose mere use starts a process
_PROCESS_MODULES = frozenset({"subprocess", "multiprocessing", "torch.multiprocessing"})
#: functions and classes (``module.qualname``) that start a process, fit a model or run a pipeline
_SLOW_OBJECTS = frozenset({
    "lightning.pytorch.trainer.trainer.Trainer",
    "aggzoo.run.pipeline.train",
    "aggzoo.run.evaluate.evaluate",
    "aggzoo.evaluation.benchmarks.evaluate_benchmarks",  # the evaluation loop over benchmark configs
    "aggzoo.cli.train.main",
    "aggzoo.cli.eval.main",
    "torch.multiprocessing.spawn.spawn",
})
_TESTS_DIR = str(Path(__file__).resolve().parent)


def _qualified(obj: object) -> str:
    return f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}"


def _names(code: types.CodeType) -> tuple[set[str], set[str]]:
    """The global names and the attribute names a code object (and the functions nested in it) reads."""
    globals_, attributes = set(), set()
    for instruction in dis.get_instructions(code):
        if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            globals_.add(instruction.argval)
        elif instruction.opname in ("LOAD_ATTR", "LOAD_METHOD"):
            attributes.add(instruction.argval)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            inner_globals, inner_attributes = _names(const)
            globals_ |= inner_globals
            attributes |= inner_attributes
    return globals_, attributes


def _is_test_code(obj: object) -> bool:
    code = getattr(obj, "__code__", None)
    return code is not None and code.co_filename.startswith(_TESTS_DIR)


def _starts_slow_work(obj: object, seen: set[int]) -> bool:
    """Whether calling ``obj`` (a function or class defined under tests/) reaches a slow object."""
    if id(obj) in seen:
        return False
    seen.add(id(obj))
    if isinstance(obj, type):
        return any(_starts_slow_work(f, seen) for f in vars(obj).values() if _is_test_code(f))
    func = inspect.unwrap(obj)
    func = getattr(getattr(func, "hypothesis", None), "inner_test", func)
    if not _is_test_code(func):
        return False
    names, attributes = _names(func.__code__)
    for name in names:
        target = func.__globals__.get(name)
        if isinstance(target, types.ModuleType):
            if target.__name__ in _PROCESS_MODULES or (target is sys and "executable" in attributes):
                return True
            members = [vars(target).get(attr) for attr in attributes]
            if any(_qualified(m) in _SLOW_OBJECTS for m in members if m is not None):
                return True
        elif target is not None:
            if _qualified(target) in _SLOW_OBJECTS:
                return True
            if (isinstance(target, type) or _is_test_code(target)) and _starts_slow_work(target, seen):
                return True
    return False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    slow = pytest.mark.slow
    for item in items:
        if item.get_closest_marker("slow") is not None or not isinstance(item, pytest.Function):
            continue
        seen: set[int] = set()
        fixtures = [d.func for defs in item._fixtureinfo.name2fixturedefs.values() for d in defs]
        if any(_starts_slow_work(f, seen) for f in [item.function, *fixtures]):
            item.add_marker(slow)
