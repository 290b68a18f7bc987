"""Config typos and wrong types fail at composition (Hydra) or before the job starts, naming the key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from aggzoo.run.config_schema import BadImages, validate_config

CONF = Path(__file__).resolve().parents[2] / "conf"


def _compose(name: str, overrides: list[str]):
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return compose(name, overrides=overrides)


def test_defaults_compose_and_validate() -> None:
    train, evaluation = _compose("train", []), _compose("eval", [])
    assert train.bad_images == BadImages.skip and train.bad_images == "skip" and train.check_images == "header"
    assert evaluation.bad_images == "fail"
    validate_config(train, "train")
    validate_config(evaluation, "eval")
    # Keys the schema does not type still compose (group keys, keys other engineers add).
    assert "model" in train and "_target_" in train.trainer


@pytest.mark.parametrize(("override", "expected"), [
    ("trainer.max_epoch=3", r"Could not override 'trainer\.max_epoch'\.\nTo append to your config use \+trainer\.max_epoch=3"),
    ("evaluate_baselin=false", r"Could not override 'evaluate_baselin'\.\nTo append to your config use \+evaluate_baselin=false"),
    ("evaluate_baseline=maybe", r"Error merging override evaluate_baseline=maybe\nValue 'maybe' is not a valid bool"),
    ("seed=abc", r"Error merging override seed=abc\nValue 'abc' of type 'str' could not be converted to Integer"),
    ("bad_images=skp", r"Error merging override bad_images=skp\nInvalid value 'skp', expected one of \[fail, skip\]"),
    ("check_images=all", r"Invalid value 'all', expected one of \[none, header, full\]"),
    ("recall_ks=[1,five]", r"Value 'five' of type 'str' could not be converted to Integer"),
])
def test_typos_and_wrong_types_fail_at_composition(override: str, expected: str) -> None:
    with pytest.raises(ConfigCompositionException) as info:
        _compose("train", [override])
    assert re.search(expected, _as_printed(info.value))


def _as_printed(err: BaseException) -> str:
    """What Hydra prints: the message, then the message of its cause."""
    return f"{err}\n{err.__cause__}" if err.__cause__ is not None else str(err)


def test_eval_types() -> None:
    with pytest.raises(ConfigCompositionException) as info:
        _compose("eval", ["image_size=[1,x]"])
    assert "Value 'x' of type 'str' could not be converted to Integer" in _as_printed(info.value)
    assert _compose("eval", ["bad_images=skip"]).bad_images == "skip"


def test_nested_types_are_checked_before_the_job() -> None:
    cfg = _compose("train", ["trainer.max_epochs=three"])  # trainer/* is free-form for Hydra ...
    with pytest.raises(ValueError, match=r"^config key 'trainer\.max_epochs': Value 'three' of type 'str' could not be "
                                         r"converted to Integer\. Fix the override or the YAML"):
        validate_config(cfg, "train")  # ... and checked by the pipeline before anything is built
    cfg = _compose("train", ["data.image_size=[a,b]"])
    with pytest.raises(ValueError, match=r"config key 'data\.image_size\[0\]'"):
        validate_config(cfg, "train")
    # A config composed without the registered schema (plain YAML) is checked the same way.
    plain = OmegaConf.create({"seed": "zero", "data": {"places_per_batch": 4}})
    with pytest.raises(ValueError, match=r"config key 'seed'"):
        validate_config(plain, "train")
