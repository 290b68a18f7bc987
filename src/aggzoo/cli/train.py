"""``aggzoo-train [group=option ...] [key=value ...]``: the training job (``python train.py`` in a checkout).

The configs are the package's own (``aggzoo/conf``: a link to the checkout's ``conf/``, a copy in an
installed wheel), so the command runs from any folder: its run folders go under ``./logs`` of the
folder it is launched from (``paths.root_dir``), and the synthetic city is generated once into the
user cache (``~/.cache/aggzoo``, or ``$AGGZOO_DATA``).
"""

from aggzoo.cli.hydra_job import hydra_job

__all__ = ["job", "main"]

job, main = hydra_job("train", "train", "aggzoo-train")

if __name__ == "__main__":
    main()
