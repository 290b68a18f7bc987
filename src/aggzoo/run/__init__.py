"""The jobs, and the only layer that reads Hydra keys: ``pipeline`` (``train(cfg)``, and ``compose_run_config``),
``evaluate`` (``evaluate(cfg)``: by name, by checkpoint, unlabelled, distributed), both importable and testable
without ``@hydra.main``; ``evaluation_options`` (the ``evaluation:`` node -> the options objects) and
``evaluation_keys`` (the old flat keys, moved with a warning); ``benchmark_config`` (benchmark nodes ->
retrieval sets); ``model_by_name`` (which model a config names); ``preflight`` (checks that fail in seconds,
before a run starts); ``config_schema`` (the typed top-level keys of ``train.yaml`` and ``eval.yaml``);
``sweep`` (multiruns that run every job and end with one table) and ``collect_runs``
(``python -m aggzoo.run.collect_runs``). It sits above :mod:`aggzoo.training`, :mod:`aggzoo.evaluation`,
:mod:`aggzoo.hub` and :mod:`aggzoo.data`, and below :mod:`aggzoo.cli` and the ``train.py`` / ``eval.py`` entry
points.
"""
