"""The ``benchmark`` config group -> :class:`~aggzoo.data.retrieval_set.RetrievalSet` values, for both jobs
(``train.py``'s validation and test benchmarks, ``eval.py``'s benchmarks).

A benchmark config (``conf/benchmark/<name>.yaml``) is a single ``{<name>: <loader node>}`` entry, so Hydra merges
``benchmark=[pitts30k_test,msls_val]`` into one mapping ``{pitts30k_test: node, msls_val: node}``.
"""

from __future__ import annotations

from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from aggzoo.data.retrieval_set import RetrievalSet
from aggzoo.errors import DatasetLayoutError

__all__ = ["load_benchmark", "load_benchmarks"]

#: the data layer's generic "where is it" sentence (data/layout.require_dir), replaced below by the
#: setting the benchmark's root is actually made of
_GENERIC_ROOT_HINT = "Point the benchmark at it (paths.data_root=/your/datasets, or benchmark.<name>.root=...)."
_ROOT_SETTINGS = {
    "paths.shared_data": "paths.shared_data=<folder holding {dataset}/> or AGGZOO_SHARED_DATA=<that folder>",
    "paths.data_root": "paths.data_root=/your/datasets or AGGZOO_DATA=/your/datasets",
}


def load_benchmark(node: Any) -> RetrievalSet:
    """A loader node (``{_target_: ..., ...}``) or a :class:`RetrievalSet` -> :class:`RetrievalSet`.

    Unlike ``hydra.utils.instantiate(node)``, a loader's error (e.g. the missing-dataset message naming
    the expected layout) reaches the user as it is, not wrapped in Hydra's ``InstantiationException``.
    """
    if isinstance(node, RetrievalSet):
        return node
    loader = instantiate(node, _partial_=True)  # nested nodes (a generated root) are built here
    retrieval_set = loader()
    if not isinstance(retrieval_set, RetrievalSet):
        raise TypeError(f"benchmark loader {node.get('_target_')!r} returned {type(retrieval_set).__name__}, "
                        "not a RetrievalSet")
    return retrieval_set


def _root_hint(name: str, node: Any) -> str:
    """Which setting moves benchmark ``name``: the ``${paths.*}`` its configured root is made of."""
    raw = ""
    if isinstance(node, DictConfig):
        raw = str(OmegaConf.to_container(node, resolve=False).get("root", ""))
    elif isinstance(node, dict):
        raw = str(node.get("root", ""))
    dataset = raw.split("}", 1)[-1].strip("/").split("/", 1)[0] or name
    for key, setting in _ROOT_SETTINGS.items():
        if "${" + key + "}" in raw:
            return f"Point the benchmark at it ({setting.format(dataset=dataset)}, or benchmark.{name}.root=...)."
    return f"Point the benchmark at it (benchmark.{name}.root=...)." if raw else _GENERIC_ROOT_HINT


def load_benchmarks(nodes: Any) -> dict[str, RetrievalSet]:
    """``{name: loader node}`` (the ``benchmark`` config group) -> ``{name: RetrievalSet}``; a missing dataset
    names the setting that its root comes from (``paths.shared_data`` for nordland_mini, ``paths.data_root``
    for the public ones)."""
    out = {}
    for name, node in (nodes or {}).items():
        try:
            out[str(name)] = load_benchmark(node)
        except DatasetLayoutError as err:
            message = str(err)
            if _GENERIC_ROOT_HINT not in message:
                raise
            raise DatasetLayoutError(message.replace(_GENERIC_ROOT_HINT, _root_hint(str(name), node))) from err
    return out
