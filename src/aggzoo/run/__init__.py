"""The jobs, and the only layer that reads Hydra keys: ``pipeline`` (``train(cfg)`` and
``evaluate(cfg)``, importable and testable without ``@hydra.main``), ``preflight`` (checks that fail
in seconds, before a run starts), ``config_schema`` (the typed top-level keys of ``train.yaml`` and
``eval.yaml``), ``sweep`` (multiruns that run every job and end with one table) and
``collect_runs`` (``python -m aggzoo.run.collect_runs``). It sits above :mod:`aggzoo.training`,
:mod:`aggzoo.evaluation`, :mod:`aggzoo.hub` and :mod:`aggzoo.data`, and below :mod:`aggzoo.cli` and
the ``train.py`` / ``eval.py`` entry points.
"""
