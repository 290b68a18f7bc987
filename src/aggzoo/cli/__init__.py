"""Console entry points: ``aggzoo-train`` / ``aggzoo-eval`` (the Hydra jobs; ``train.py`` and ``eval.py``
at the top of a checkout wrap them) and ``aggzoo models | info | export | manifest`` (also
``python -m aggzoo.cli.models | export | manifest``). The top layer: each command calls the layers
below and reports a :class:`~aggzoo.errors.UserError` as one ``error:`` line, exit status 2
(:func:`aggzoo.cli.reporting.reported_user_errors`)."""

from pathlib import Path

#: The Hydra configs the jobs compose: the package's ``conf`` (in a checkout a link to the repository's
#: ``conf/``, in an installed wheel a copy of it). An absolute path, so Hydra reads it as a folder
#: whether the job is started as a console script, ``python -m`` or ``python train.py``.
CONFIG_DIR = str(Path(__file__).resolve().parent.parent / "conf")
