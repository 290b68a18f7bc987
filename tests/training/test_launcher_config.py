"""The SLURM launcher config composes with the submitit plugin and takes its sizes from the trainer."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf
from train_helpers import CONF

pytest.importorskip("hydra_plugins.hydra_submitit_launcher",
                    reason="optional extra: pip install hydra-submitit-launcher (aggzoo[slurm])")


def test_slurm_launcher_asks_for_one_task_per_gpu_of_the_ddp_trainer() -> None:
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=["hydra/launcher=slurm", "trainer=ddp", "trainer.devices=4",
                                          "trainer.num_nodes=2", "experiment=salad_dinov2"], return_hydra_config=True)
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=False)
    assert launcher["_target_"].endswith("SlurmLauncher")
    assert launcher["tasks_per_node"] == launcher["gpus_per_node"] == "${trainer.devices}"
    assert launcher["nodes"] == "${trainer.num_nodes}" and launcher["max_num_timeout"] > 0
    assert (cfg.hydra.launcher.tasks_per_node, cfg.hydra.launcher.gpus_per_node, cfg.hydra.launcher.nodes) == (4, 4, 2)
    assert cfg.trainer.strategy._target_.endswith("DDPStrategy")
