"""``ckpt_path=last`` resumes with the run's own saved overrides, replayed on aggzoo's conf/: values
and config choices are taken, nothing that names code is (issue 14 item 8; the real train.py
resume: tests/training/test_ctrl_c_resume.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from aggzoo.errors import ConfigError
from aggzoo.run.pipeline import compose_run_config
from aggzoo.run.resume import resume_config

CONF = Path(__file__).resolve().parents[2] / "conf"

#: what a tampered (or test-tool) .hydra/overrides.yaml could hold
SAVED = ["head=gem", "data.places_per_batch=6", "seed=11", "paths.log_dir=/elsewhere", "hydra.run.dir=/elsewhere/x",
         "+callbacks.evil._target_=builtins.exec", "+callbacks.evil.source=x",
         "optimizer._target_=os.system", "++_target_=os.system", "trainer.plugins=[{_target_: os.system, command: touch}]"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder as Hydra leaves it: the run's overrides and its composed config."""
    run = tmp_path_factory.mktemp("resume") / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(SAVED))
    saved = compose_run_config(CONF, "train", ["head=gem", "data.places_per_batch=6", "seed=11"], run)
    OmegaConf.save(saved, run / ".hydra" / "config.yaml")
    return run


def test_values_and_choices_are_replayed_and_code_is_not(run: Path, tmp_path: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    now = compose_run_config(CONF, "train", ["ckpt_path=last"], tmp_path / "launch")
    default_optimizer = now.optimizer._target_
    cfg = resume_config(now, run, overrides=["ckpt_path=last", "paths.log_dir=/here"])
    assert cfg.head._target_ == "aggzoo.models.heads.gem.GeM"  # conf/head/gem.yaml, aggzoo's own file
    assert (cfg.data.places_per_batch, cfg.seed) == (6, 11)
    assert "evil" not in cfg.callbacks and cfg.optimizer._target_ == default_optimizer and "_target_" not in cfg
    assert OmegaConf.to_container(cfg.trainer.plugins, resolve=False) == \
        [{"_target_": "aggzoo.training.checkpointing.DurableCheckpointIO"}]
    assert cfg.paths == now.paths and cfg.ckpt_path == "last"  # where things are: this command's
    warning = " ".join(r.getMessage() for r in caplog.records)
    for line in SAVED[5:]:
        assert line in warning  # each one named, to be passed again if the run needs it


def test_an_override_given_again_must_agree(run: Path, tmp_path: Path) -> None:
    same = compose_run_config(CONF, "train", ["ckpt_path=last", "head=gem", "seed=11"], tmp_path / "a")
    assert resume_config(same, run, overrides=["ckpt_path=last", "head=gem", "seed=11"]).seed == 11
    other = compose_run_config(CONF, "train", ["ckpt_path=last", "data.places_per_batch=8"], tmp_path / "b")
    with pytest.raises(ConfigError, match=r"the override data.places_per_batch=8 differs from it: "
                                          r"data.places_per_batch is 6 there, 8 now\. Drop the override"):
        resume_config(other, run, overrides=["ckpt_path=last", "data.places_per_batch=8"])


def test_a_run_without_a_saved_config_resumes_with_the_config_given(tmp_path: Path) -> None:
    cfg = compose_run_config(CONF, "train", ["head=gem"], tmp_path / "x")
    assert resume_config(cfg, tmp_path / "no_hydra_folder", overrides=["head=gem"]) is cfg
