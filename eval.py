"""Evaluate a checkpoint: ``python eval.py ckpt_path=PATH benchmark=NAME`` (or ``benchmark=[a,b]``)."""

import os

import hydra
from omegaconf import DictConfig

import aggzoo
import aggzoo.run.config_schema  # noqa: F401  (typed schema: a wrong override type fails at composition)
from aggzoo.cli.hydra_errors import run_hydra_main
from aggzoo.cli.quiet import quiet_startup_noise
from aggzoo.cli.reporting import reported_user_errors

# paths.root_dir (conf/paths/default.yaml): the folder the job is launched from, unless set.
os.environ.setdefault("AGGZOO_ROOT", os.getcwd())


@hydra.main(version_base="1.3", config_path="conf", config_name="eval")
def main(cfg: DictConfig) -> None:
    quiet_startup_noise()  # faiss's failed AVX loads, Lightning's adverts (aggzoo.cli.quiet)
    from aggzoo.run.pipeline import evaluate
    from aggzoo.run.sweep import keep_sweeping

    # A user's mistake prints one 'error: ...' line, exit status 2; in a multirun (-m) a failed job is
    # recorded and the sweep goes on, then ends with its table (conf/hydra/default.yaml: callbacks).
    with reported_user_errors(), keep_sweeping():
        evaluate(cfg)


if __name__ == "__main__":
    # A command line Hydra cannot compose (head=nosuch, an unknown key) is one error: line too, exit 2.
    run_hydra_main(main, "eval.py")
