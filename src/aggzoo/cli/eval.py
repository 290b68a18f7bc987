"""``aggzoo-eval [ckpt_path=PATH] [benchmark=NAME | benchmark=[a,b]] [key=value ...]``: the evaluation job
(``python eval.py`` in a checkout).

The configs are the package's own (``aggzoo/conf``: a link to the checkout's ``conf/``, a copy in an
installed wheel), so the command runs from any folder: its result folders go under ``./logs`` of the
folder it is launched from (``paths.root_dir``), and the synthetic city is generated once into the
user cache (``~/.cache/aggzoo``, or ``$AGGZOO_DATA``).
"""

import os

import hydra
from omegaconf import DictConfig

import aggzoo.run.config_schema  # noqa: F401  (typed schema: a wrong override type fails at composition)
from aggzoo.cli import CONFIG_DIR
from aggzoo.cli.hydra_errors import run_hydra_main
from aggzoo.cli.quiet import quiet_startup_noise
from aggzoo.cli.reporting import reported_user_errors

__all__ = ["job", "main"]

# paths.root_dir (conf/paths/default.yaml): the folder the job is launched from, unless set.
os.environ.setdefault("AGGZOO_ROOT", os.getcwd())


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="eval")
def job(cfg: DictConfig) -> None:
    quiet_startup_noise()  # faiss's failed AVX loads, Lightning's adverts (aggzoo.cli.quiet)
    from aggzoo.run.pipeline import evaluate
    from aggzoo.run.sweep import keep_sweeping

    # A user's mistake prints one 'error: ...' line, exit status 2; in a multirun (-m) a failed job is
    # recorded and the sweep goes on, then ends with its table (conf/hydra/default.yaml: callbacks).
    with reported_user_errors(), keep_sweeping():
        evaluate(cfg)



def main(script: str = "aggzoo-eval") -> None:
    """The console entry point: the Hydra job, with a command line Hydra cannot compose (``head=nosuch``,
    an unknown key) reported as one ``error:`` line, exit status 2, naming ``script``'s ``--help``."""
    run_hydra_main(job, script)


if __name__ == "__main__":
    main()
