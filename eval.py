"""Evaluate a model: ``python eval.py model=NAME benchmark=NAME`` (or ``benchmark=[a,b]``; NAME: a zoo name, a
checkpoint, a run folder, local-dir:/hf-hub:; ``ckpt_path=`` too), or without ground truth ``database=DIR queries=DIR``.

A thin wrapper of :mod:`aggzoo.cli.eval` (the ``aggzoo-eval`` command of an installed aggzoo):
the same job, on the configs of ``conf/`` (which the package links in as ``aggzoo/conf``).
"""

from aggzoo.cli.eval import main

if __name__ == "__main__":
    main("eval.py")
