"""data.val_split: validation places carved off the training data, by place, with a gap, deterministic
(issue 14 item 9: the README's nordland_mini command chose its best checkpoint on the test split)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hydra_helpers import compose_run_config

from aggzoo.data.gsv_cities import GSVCitiesDataset
from aggzoo.data.place_split import hold_out_places, split_places, val_split_from_config
from aggzoo.errors import ConfigError


def test_split_is_the_last_places_after_a_gap() -> None:
    ids = np.random.default_rng(0).permutation(np.arange(100, 200)).tolist()  # any order in, sorted ids out
    split = split_places(ids, places=10, gap=3)
    assert split.train == tuple(range(100, 187)) and split.gap == (187, 188, 189) and split.val == tuple(range(190, 200))
    assert split_places(sorted(ids), places=10, gap=3) == split  # deterministic, whatever the input order
    assert min(split.val) - max(split.train) == 4  # three unused places between the two sides
    assert split_places(ids, places=98, gap=0).train == (100, 101)  # two places left to train on is enough


@pytest.mark.parametrize(("places", "gap", "message"), [
    (0, 0, "data.val_split.places=0 must be an integer of at least 1"),
    (5, -1, "data.val_split.gap=-1 one of at least 0"),
    ("5", 0, "must be an integer"),
    (95, 4, "95 validation places + a gap of 4 leave 1 of the 100 training places"),
])
def test_split_refuses_what_cannot_work(places: object, gap: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("+", r"\+")):
        split_places(range(100), places=places, gap=gap)


def test_unknown_option_is_named(nordland_mini: Path) -> None:
    dataset = GSVCitiesDataset(nordland_mini / "gsv", img_per_place=2)
    with pytest.raises(ConfigError, match="data.val_split.size is not an option; data.val_split takes places"):
        val_split_from_config(dataset, {"size": 200})


def _place_of(path: Path) -> int:
    """The place id in a GSV-Cities file name (``<city>_<place:07d>_...``): independent of the split code."""
    return int(path.name.split("_")[1])


def test_nordland_mini_hold_out(nordland_mini: Path) -> None:
    dataset = GSVCitiesDataset(nordland_mini / "gsv", img_per_place=2)
    all_ids = dataset.place_ids.copy()
    assert len(all_ids) == 2056
    held = hold_out_places(dataset, places=200, gap=10, name="nordland_mini_val")
    train_ids = set(dataset.place_ids.tolist())
    val_ids = {_place_of(p) for p in held.database_paths}
    # sizes: 200 places, one summer database image and one winter query each; 1846 places left to train on
    assert held.name == "nordland_mini_val" and held.num_database == 200 and held.num_queries == 200
    assert len(dataset) == len(train_ids) == 2056 - 200 - 10
    # disjoint by place, and the gap: the 10 place ids just before the validation block are on neither side
    assert not train_ids & val_ids and val_ids == set(all_ids[-200:].tolist())
    assert set(all_ids.tolist()) - train_ids - val_ids == set(all_ids[-210:-200].tolist())
    assert min(val_ids) - max(train_ids) == 11
    training_files = {p for i in range(len(dataset)) for p in dataset.candidate_paths(i)}
    assert not training_files & (set(held.database_paths) | set(held.query_paths))
    # each query's one positive is its own place, the other season
    for query, positive in zip(held.query_paths, held.positives):
        (index,) = positive
        assert _place_of(held.database_paths[index]) == _place_of(query)
        assert "_2012_07_" in held.database_paths[index].name and "_2012_02_" in query.name
    # deterministic: a second dataset gives the same split
    again = GSVCitiesDataset(nordland_mini / "gsv", img_per_place=2)
    assert hold_out_places(again, places=200, gap=10, name="nordland_mini_val") == held
    assert np.array_equal(again.place_ids, dataset.place_ids)


def test_nordland_recipe_validates_on_training_places(nordland_mini: Path, tmp_path: Path) -> None:
    """The recipe the README runs: validation on the carved-off places, never on the test section."""
    from aggzoo.run.pipeline import build_training

    cfg = compose_run_config("train", ["experiment=nordland_mini", f"paths.shared_data={nordland_mini.parent}"], tmp_path)
    parts = build_training(cfg)
    val_sets, test_sets = parts.datamodule.val_sets, parts.test_sets
    assert list(val_sets) == ["nordland_mini_val"] and list(test_sets) == ["nordland_mini"]
    (val,), (test,) = val_sets.values(), test_sets.values()
    assert val.num_database == val.num_queries == 200
    test_files = set(test.database_paths) | set(test.query_paths)
    assert not test_files & (set(val.database_paths) | set(val.query_paths))
    assert len(parts.datamodule.train_dataset) == 2056 - 210
