"""What the train job tells a user when it ends: which row of its test table is which model, and where
its run folder and checkpoints are and what to run next.

Kept apart from :mod:`aggzoo.run.pipeline` so that the job's wording has one home and is testable
without training.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import lightning.pytorch as L
from omegaconf import DictConfig

__all__ = ["NO_TRAINING_NOTE", "closing_for", "closing_lines", "eval_command", "trained_row_label"]

#: printed above the test table when the fit ran no optimisation step (trainer.max_epochs=0, a
#: limit_train_batches=0, or a resumed run that was already complete)
NO_TRAINING_NOTE = ("note: no training step ran (trainer.global_step is 0, e.g. trainer.max_epochs=0), so the "
                    "model tested below is the untrained one (after any data-driven init); no checkpoint was written")


def trained_row_label(global_step: int) -> str:
    """The ``run_summary.json`` / ``test_results.json`` label of the model tested after ``fit``: ``trained``
    only when an optimisation step ran, else ``untrained`` (it is the model as initialised)."""
    return "trained" if global_step > 0 else "untrained"


def _shown(path: Path) -> str:
    """``path`` relative to the working folder when it lies inside it (shorter to copy), else absolute."""
    try:
        return os.path.relpath(path) if Path(path).resolve().is_relative_to(Path.cwd().resolve()) else str(path)
    except ValueError:  # another drive (Windows)
        return str(path)


def _eval_program() -> str:
    """How this installation runs the evaluation job: ``aggzoo-eval`` when training was started as the
    ``aggzoo-train`` console script (an installed wheel has no eval.py), else ``python eval.py``."""
    return "aggzoo-eval" if Path(sys.argv[0]).name.startswith("aggzoo-train") else "python eval.py"


def eval_command(checkpoint: Path, benchmarks: Sequence[str], image_size: Sequence[int],
                 extra: Sequence[str] = ()) -> str:
    """``python eval.py ckpt_path=... benchmark=...`` that evaluates ``checkpoint`` as the train job did
    (the same benchmarks and evaluation size; ``extra`` overrides such as ``synthetic=tiny``)."""
    names = list(benchmarks)
    selected = names[0] if len(names) == 1 else "[" + ",".join(names) + "]"
    parts = [_eval_program(), f"ckpt_path={_shown(checkpoint)}"]
    if names:
        parts.append(f"benchmark={selected}" if len(names) == 1 else f'"benchmark={selected}"')
    parts.append(f"image_size=[{','.join(str(int(s)) for s in image_size)}]")
    return " ".join([*parts, *extra])


def closing_lines(run_dir: Path, best: Path | None, last: Path | None, *,
                  chosen_on: tuple[str | None, float | None] = (None, None), benchmarks: Sequence[str],
                  image_size: Sequence[int],
                  extra: Sequence[str] = (), files: Mapping[str, Path] | None = None) -> list[str]:
    """The last lines of ``train.py``: the run folder, the best and the last checkpoint (and on what the
    best was chosen), the result files, and the eval command to run next.

    Args:
        best, last: ``ModelCheckpoint``'s ``best_model_path`` and ``last_model_path`` (None when empty).
        chosen_on: ``(monitor, best_score)``, the metric the best checkpoint was chosen on and its value (a
            fraction for ``val/R@k``, printed in percent).
        files: ``{"what": path}`` of result files to name (``run_summary.json``, ...), shown when they exist.
    """
    monitor, best_score = chosen_on
    lines = [f"run folder:       {_shown(run_dir)}"]
    if best is not None:
        score = "" if best_score is None else (
            f" = {100 * best_score:.2f} %" if monitor and "R@" in monitor else f" = {best_score:.4g}")
        lines.append(f"best checkpoint:  {_shown(best)} (chosen on {monitor}{score})")
    elif last is not None:
        metric = f"validation metric {monitor}" if monitor else "validation metric"
        lines.append(f"best checkpoint:  none (no {metric} to choose on: the last checkpoint "
                     "was tested; add a validation set, e.g. data.val_split, to select one)")
    lines.append(f"last checkpoint:  {_shown(last)}" if last is not None
                 else "last checkpoint:  none (no training step ran)")
    for what, path in (files or {}).items():
        if Path(path).is_file():
            lines.append(f"{what + ':':<17} {_shown(path)}")
    target = best if best is not None else last
    if target is not None:
        lines.append("next:             " + eval_command(Path(target), benchmarks, image_size, extra))
    return lines


def closing_for(cfg: DictConfig, trainer: L.Trainer, run_dir: Path) -> list[str]:
    """:func:`closing_lines` of a finished ``train(cfg)``: the checkpoints its ``ModelCheckpoint`` wrote and
    an eval command with the same test benchmarks, evaluation size and synthetic city."""
    from hydra.core.hydra_config import HydraConfig

    ckpt = trainer.checkpoint_callback
    # Without a monitored metric (monitor: null, no validation set) ModelCheckpoint's "best" is only its newest file.
    chosen = ckpt is not None and getattr(ckpt, "best_model_path", "") and getattr(ckpt, "monitor", None)
    best = Path(ckpt.best_model_path) if chosen else None
    last = Path(ckpt.last_model_path) if ckpt is not None and getattr(ckpt, "last_model_path", "") else None
    score = getattr(ckpt, "best_model_score", None)
    extra = []
    if HydraConfig.initialized():
        # the eval job builds the generated sets from the same groups (conf/eval.yaml has both at default)
        for group in ("synthetic", "synthetic_landmarks"):
            choice = HydraConfig.get().runtime.choices.get(group)
            if choice and choice != "default":
                extra.append(f"{group}={choice}")
    return closing_lines(run_dir, best, last,
                         chosen_on=(getattr(ckpt, "monitor", None), float(score) if score is not None else None),
                         benchmarks=[str(name) for name in (cfg.get("test_benchmarks") or {})],
                         image_size=list(cfg.data.eval_image_size), extra=extra,
                         files={"results": run_dir / "test_results.json", "run summary": run_dir / "run_summary.json"})
