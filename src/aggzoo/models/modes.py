"""Running a module in eval mode for a while (extraction, calibration, data-driven init, checks)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

__all__ = ["evaluating"]


@contextmanager
def evaluating(module: nn.Module) -> Iterator[nn.Module]:
    """``module`` in eval mode inside the block; afterwards, even on an error, back in the mode it had
    (through ``train(mode)``, so a backbone re-applies its own rule, e.g. frozen stages stay in eval)."""
    was_training = module.training
    module.eval()
    try:
        yield module
    finally:
        module.train(was_training)
