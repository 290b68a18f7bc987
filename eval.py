"""Evaluate a model: ``python eval.py model=NAME benchmark=NAME`` (or ``benchmark=[a,b]``; NAME: a zoo name, a
checkpoint, a run folder, local-dir:/hf-hub:; ``ckpt_path=`` too), or without ground truth ``database=DIR queries=DIR``."""

import os

import hydra
from omegaconf import DictConfig

import aggzoo
import aggzoo.run.config_schema  # noqa: F401  (typed schema: a wrong override type fails at composition)
from aggzoo.cli.reporting import reported_user_errors

# paths.root_dir (conf/paths/default.yaml): the folder the job is launched from, unless set.
os.environ.setdefault("AGGZOO_ROOT", os.getcwd())


@hydra.main(version_base="1.3", config_path="conf", config_name="eval")
def main(cfg: DictConfig) -> None:
    from aggzoo.run.pipeline import evaluate
    from aggzoo.run.sweep import keep_sweeping

    # A user's mistake prints one 'error: ...' line, exit status 2; in a multirun (-m) a failed job is
    # recorded and the sweep goes on, then ends with its table (conf/hydra/default.yaml: callbacks).
    with reported_user_errors(), keep_sweeping():
        evaluate(cfg)


if __name__ == "__main__":
    main()
