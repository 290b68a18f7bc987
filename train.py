"""Train a VPR model: ``python train.py [backbone=...] [head=...] [data=...] [key=value ...]``.

A thin wrapper of :mod:`aggzoo.cli.train` (the ``aggzoo-train`` command of an installed aggzoo):
the same job, on the configs of ``conf/`` (which the package links in as ``aggzoo/conf``).
"""

from aggzoo.cli.train import main

if __name__ == "__main__":
    main("train.py")
