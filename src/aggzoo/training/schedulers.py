"""Learning-rate schedules as ``LambdaLR`` factories stepped every optimisation step.

Each factory takes the optimizer plus the run's length (``total_steps``, ``steps_per_epoch``),
which only the trainer knows, and the recipe's hyperparameters (from ``conf/scheduler/*.yaml``,
``_partial_: true``). Stepping per step lets warmups be given in steps, as the papers do, while
milestones are given in epochs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

__all__ = ["warmup_cosine", "warmup_multistep", "step_decay", "linear_decay", "constant"]


def _warmup(step: int, warmup_steps: int) -> float:
    return min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else 1.0


def warmup_cosine(optimizer: Optimizer, *, total_steps: int, steps_per_epoch: int,
                  warmup_steps: int = 0, min_lr_ratio: float = 0.0) -> LambdaLR:
    """Linear warmup over ``warmup_steps``, then cosine decay to ``min_lr_ratio`` x the base LR
    at ``total_steps``."""
    decay_steps = max(1, total_steps - warmup_steps)

    def factor(step: int) -> float:
        if step < warmup_steps:
            return _warmup(step, warmup_steps)
        progress = min(1.0, (step - warmup_steps) / decay_steps)
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return LambdaLR(optimizer, factor)


def warmup_multistep(optimizer: Optimizer, *, total_steps: int, steps_per_epoch: int,
                     warmup_steps: int = 0, milestones: Sequence[int] = (), gamma: float = 0.1,
                     warmup_epochs: float = 0.0) -> LambdaLR:
    """Linear warmup, then multiply the LR by ``gamma`` at each epoch in ``milestones`` (the
    ConvAP / MixVPR recipes: x0.3 at epochs [5, 10, 15, 25]; BoQ: x0.1 at [10, 20, 30]).

    The warmup lasts ``warmup_steps`` steps, or ``warmup_epochs`` epochs when that is set (BoQ
    warms up for 10 epochs, however many steps an epoch has)."""
    if warmup_epochs:
        warmup_steps = int(round(warmup_epochs * steps_per_epoch))
    milestone_steps = sorted(int(m) * steps_per_epoch for m in milestones)

    def factor(step: int) -> float:
        drops = sum(1 for m in milestone_steps if step >= m)
        return _warmup(step, warmup_steps) * gamma**drops

    return LambdaLR(optimizer, factor)


def step_decay(optimizer: Optimizer, *, total_steps: int, steps_per_epoch: int, step_epochs: int = 1,
               gamma: float = 0.5, warmup_steps: int = 0) -> LambdaLR:
    """Multiply the LR by ``gamma`` every ``step_epochs`` epochs, after an optional linear warmup
    (the ImAge recipe: x0.5 every 3 epochs, ``StepLR(step_size=3 epochs)``)."""
    if step_epochs < 1:
        raise ValueError(f"step_epochs must be >= 1, got {step_epochs}")
    period = step_epochs * steps_per_epoch

    def factor(step: int) -> float:
        return _warmup(step, warmup_steps) * gamma ** (step // period)

    return LambdaLR(optimizer, factor)


def linear_decay(optimizer: Optimizer, *, total_steps: int, steps_per_epoch: int,
                 start_factor: float = 1.0, end_factor: float = 0.2, decay_steps: int | None = None) -> LambdaLR:
    """Linear interpolation from ``start_factor`` to ``end_factor`` over ``decay_steps`` (all the
    run by default), then constant (the SALAD recipe: 1 -> 0.2 over 4000 steps)."""
    span = max(1, decay_steps if decay_steps is not None else total_steps)

    def factor(step: int) -> float:
        t = min(1.0, step / span)
        return start_factor + (end_factor - start_factor) * t

    return LambdaLR(optimizer, factor)


def constant(optimizer: Optimizer, *, total_steps: int, steps_per_epoch: int) -> LambdaLR:
    """No schedule."""
    return LambdaLR(optimizer, lambda step: 1.0)
