"""The robustness hooks :mod:`aggzoo.pipeline` calls around a job.

- :func:`check_config`: the typed keys of the composed config (:mod:`aggzoo.config_schema`).
- :func:`before_training` / :func:`after_training`: the ``bad_images`` policy of the training set
  (skipped files listed in ``<run>/bad_images.tsv``), the preflight checks of
  :mod:`aggzoo.validation`, and the report of a Ctrl-C stop
  (:class:`~aggzoo.training.interrupt.GracefulInterrupt`).
- :class:`EvaluationGuard`: the same for ``eval.py``: preflight, ``bad_images=skip`` (unreadable
  images dropped before extraction, counted in the results), notes under the results table.
- :func:`reported_user_errors`: for the entry points, prints an error the user caused (bad data,
  config, disk full, diverged training) as one message and exits with status 2, without a stack
  trace from inside a library.
"""

from __future__ import annotations

import errno
import logging
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from aggzoo.config_schema import ConfigTypeError, validate_config
from aggzoo.data.errors import DatasetFormatError, DatasetLayoutError
from aggzoo.data.image_policy import SKIPPED_LIST_NAME, ImagePolicy, drop_unreadable
from aggzoo.data.images import ImageReadError
from aggzoo.data.retrieval_set import RetrievalSet
from aggzoo.training.guards import NonFiniteError
from aggzoo.training.interrupt import GracefulInterrupt
from aggzoo.training.safe_save import DiskFullError
from aggzoo.validation import PreflightError, check_evaluation, check_training, result_notes

__all__ = ["check_config", "before_training", "after_training", "EvaluationGuard", "USER_ERRORS", "user_message",
           "reported_user_errors"]

log = logging.getLogger(__name__)

#: Errors whose message already says what was expected and how to fix it.
USER_ERRORS: tuple[type[BaseException], ...] = (
    PreflightError, ConfigTypeError, ImageReadError, DatasetLayoutError, DatasetFormatError, DiskFullError,
    NonFiniteError)


def _choice(value: Any) -> str:
    return str(getattr(value, "value", value))


def check_config(cfg: DictConfig, kind: str) -> None:
    """Raise one ``ValueError`` naming a config key whose value has the wrong type."""
    validate_config(cfg, kind)


def before_training(cfg: DictConfig, parts: Any) -> ImagePolicy:
    """Give the training set its ``bad_images`` policy and run the preflight checks.

    ``parts`` is :class:`aggzoo.pipeline.TrainingParts` (``model``, ``datamodule``, ``test_sets``).
    """
    policy = ImagePolicy(
        on_error=_choice(cfg.get("bad_images", "skip")), log_path=Path(cfg.paths.output_dir) / SKIPPED_LIST_NAME,
        hint="Fix or remove the file, or skip unreadable training images with bad_images=skip")
    dataset = parts.datamodule.train_dataset
    if hasattr(dataset, "bad_images"):
        dataset.bad_images = policy
    check_training(parts.model, train_dataset=dataset, places_per_batch=int(cfg.data.places_per_batch),
                   image_size=cfg.data.image_size, eval_image_size=cfg.data.eval_image_size,
                   val_sets=parts.datamodule.val_sets, test_sets=parts.test_sets,
                   check_images=_choice(cfg.get("check_images", "header")), num_workers=int(cfg.data.num_workers))
    return policy


def after_training(trainer: Any, policy: ImagePolicy) -> dict[str, Any]:
    """``{"interrupted": checkpoint}`` after a Ctrl-C stop, ``{"bad_images": {path: reason}}`` when
    training images were skipped; prints what happened."""
    out: dict[str, Any] = {}
    skipped = policy.finalize()
    if skipped:
        places = [k for k in skipped if k.startswith("place:")]
        files = len(skipped) - len(places)
        dropped = f" and replaced {len(places)} places left with too few readable images" if places else ""
        print(f"note: skipped {files} unreadable training images{dropped}; listed in {policy.log_path}")
        out["bad_images"] = skipped
    interrupt = next((c for c in trainer.callbacks if isinstance(c, GracefulInterrupt) and c.saved_path), None)
    if interrupt is not None:
        print(f"interrupted at global step {trainer.global_step}: saved {interrupt.saved_path}; no test evaluation. "
              f"Resume with ckpt_path={interrupt.saved_path}")
        out["interrupted"] = str(interrupt.saved_path)
    return out


class EvaluationGuard:
    """Preflight, ``bad_images`` policy and result notes of one evaluation job."""

    def __init__(self, cfg: DictConfig) -> None:
        self.cfg = cfg
        self.policy = ImagePolicy(
            on_error=_choice(cfg.get("bad_images", "fail")), log_path=Path(cfg.paths.output_dir) / SKIPPED_LIST_NAME,
            hint="A benchmark with a missing image is not that benchmark: fix or re-download the file, or "
                 "evaluate without unreadable images with bad_images=skip (not comparable to published numbers)")
        self.skipped: dict[str, dict[str, int]] = {}

    def prepare(self, model: Any, sets: Mapping[str, RetrievalSet]) -> dict[str, RetrievalSet]:
        """Check everything, then (under ``skip``) drop the unreadable images of each set."""
        num_workers = int(self.cfg.get("num_workers", 0))
        # Under skip every image is decoded below anyway; the header scan would only repeat it.
        scan = "none" if self.policy.skips else _choice(self.cfg.get("check_images", "header"))
        check_evaluation(model, image_size=self.cfg.image_size, sets=sets, check_images=scan, num_workers=num_workers)
        if not self.policy.skips:
            return dict(sets)
        out = {}
        for name, retrieval_set in sets.items():
            out[name], counts = drop_unreadable(retrieval_set, self.policy, num_workers=num_workers)
            if any(counts.values()):
                self.skipped[out[name].name] = counts
        return out

    def annotate(self, results: Sequence[Any]) -> None:
        """Record the skipped-image counts in each result (they reach the JSON through ``extras``)."""
        for result in results:
            result.extras.update(self.skipped.get(result.name, {}))

    def notes(self, results: Sequence[Any]) -> str:
        """Lines to print under the results table (empty when there is nothing to say)."""
        skipped = self.policy.finalize()
        return "\n".join(result_notes(results, self.policy.log_path if skipped else None))


def user_message(err: BaseException) -> str:
    """The one-line message a user sees for one of :data:`USER_ERRORS`."""
    text = str(err)
    # An error raised in a DataLoader worker comes back as "Caught X in DataLoader worker process N.
    # Original Traceback ...": the last line is the original message.
    if "Original Traceback" in text:
        last = [line for line in text.splitlines() if line.strip()][-1]
        text = last.split(": ", 1)[1] if ": " in last else last
    return text


@contextmanager
def reported_user_errors(extra: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """Print a :data:`USER_ERRORS` error as ``error: <message>`` on stderr and exit with status 2.

    Other exceptions (bugs) propagate with their stack trace. Usage in an entry point::

        with reported_user_errors():
            train(cfg)
    """
    try:
        yield
    except USER_ERRORS + tuple(extra) as err:
        _exit(user_message(err))
    except OSError as err:
        if err.errno not in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
            raise
        # A full disk outside the checkpoint writer (logs, results, the bad-image list).
        _exit(f"disk full while writing {err.filename or 'the run folder'} ({err.strerror}). Free some space or "
              "write to a larger disk (paths.output_dir=...); a training run resumes with ckpt_path=last.")


def _exit(message: str) -> None:
    log.error("%s", message)
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2) from None
