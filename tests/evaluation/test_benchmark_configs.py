"""Every conf/benchmark/*.yaml: one {name: loader node} entry whose keys are the loader's parameters,
and, with the data absent, one clear error naming the expected layout and where the data is published."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from hydra.utils import get_method
from omegaconf import OmegaConf

from aggzoo.errors import DatasetLayoutError
from aggzoo.run.benchmark_config import load_benchmark

BENCHMARK_DIR = Path(__file__).resolve().parents[2] / "conf" / "benchmark"
FILES = sorted(BENCHMARK_DIR.glob("*.yaml"))
# Generated on demand (their root is itself a node that writes the data), so never "missing".
GENERATED = {"synthetic_test", "synthetic_val", "synthetic_landmarks"}


def node_of(path: Path, tmp_path: Path):
    cfg = OmegaConf.create({"paths": {"data_root": str(tmp_path / "data"), "shared_data": str(tmp_path / "shared")},
                            "benchmark": OmegaConf.load(path)})
    (name, node), = cfg.benchmark.items()
    return name, node


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_keys_are_loader_parameters(path, tmp_path):
    name, node = node_of(path, tmp_path)
    assert name == path.stem, "the single top-level key must be the file name (benchmark=[a,b] merges them)"
    parameters = inspect.signature(get_method(node["_target_"])).parameters
    unknown = set(node) - {"_target_"} - set(parameters)
    assert not unknown, f"{path.name}: keys {unknown} are not parameters of {node['_target_']}"


@pytest.mark.parametrize("path", [p for p in FILES if p.stem not in GENERATED], ids=lambda p: p.stem)
def test_missing_dataset_names_layout_and_source(path, tmp_path):
    _, node = node_of(path, tmp_path)
    with pytest.raises(DatasetLayoutError) as err:
        load_benchmark(node)                                 # the loader's own error, not Hydra's wrapper
    message = str(err.value)
    assert str(tmp_path) in message                        # where it looked
    assert "Expected layout" in message                    # what it expected
    assert "http" in message or "your own images" in message   # where the data is published
