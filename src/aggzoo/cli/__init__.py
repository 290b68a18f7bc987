"""Console entry points: ``python -m aggzoo.cli.models | export | manifest`` (``train.py`` and
``eval.py`` at the top of a checkout are the Hydra ones). The top layer: each command calls the
layers below and reports a :class:`~aggzoo.errors.UserError` as one ``error:`` line, exit status 2
(:func:`aggzoo.cli.reporting.reported_user_errors`)."""
