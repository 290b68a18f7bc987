"""Evaluate a checkpoint: ``python eval.py ckpt_path=PATH benchmark=NAME`` (or ``benchmark=[a,b]``).

A thin wrapper of :mod:`aggzoo.cli.eval` (the ``aggzoo-eval`` command of an installed aggzoo):
the same job, on the configs of ``conf/`` (which the package links in as ``aggzoo/conf``).
"""

from aggzoo.cli.eval import main

if __name__ == "__main__":
    main("eval.py")
