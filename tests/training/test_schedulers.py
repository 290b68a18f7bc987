"""LR schedule factories: closed-form factors at known steps."""

from __future__ import annotations

import math

import pytest
import torch

from aggzoo.training.schedulers import linear_decay, warmup_cosine, warmup_multistep


def _factors(make, steps: int, **kwargs) -> list[float]:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = make(opt, **kwargs)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_warmup_cosine() -> None:
    f = _factors(warmup_cosine, 110, total_steps=110, steps_per_epoch=11, warmup_steps=10, min_lr_ratio=0.0)
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert f[10] == pytest.approx(1.0) and f[60] == pytest.approx(0.5)
    assert f[109] == pytest.approx(0.5 * (1 + math.cos(math.pi * 99 / 100)))


def test_warmup_multistep_drops_at_epoch_milestones() -> None:
    f = _factors(warmup_multistep, 40, total_steps=40, steps_per_epoch=10, warmup_steps=0,
                 milestones=[1, 3], gamma=0.3)
    assert f[9] == 1.0 and f[10] == pytest.approx(0.3) and f[29] == pytest.approx(0.3) and f[30] == pytest.approx(0.09)


def test_linear_decay_salad() -> None:
    f = _factors(linear_decay, 60, total_steps=60, steps_per_epoch=10, start_factor=1.0, end_factor=0.2,
                 decay_steps=40)
    assert f[0] == 1.0 and f[20] == pytest.approx(0.6) and f[40] == pytest.approx(0.2) and f[59] == pytest.approx(0.2)


def test_step_decay_image() -> None:
    from aggzoo.training.schedulers import step_decay

    f = _factors(step_decay, 70, total_steps=70, steps_per_epoch=10, step_epochs=3, gamma=0.5)
    assert f[29] == 1.0 and f[30] == pytest.approx(0.5) and f[59] == pytest.approx(0.5) and f[60] == pytest.approx(0.25)


def test_warmup_in_epochs_boq() -> None:
    # BoQ: linear warmup over 10 epochs, then x0.1 at epochs 10/20/30 (here 4 steps per epoch)
    f = _factors(warmup_multistep, 90, total_steps=160, steps_per_epoch=4, warmup_steps=999, warmup_epochs=10,
                 milestones=[10, 20], gamma=0.1)
    assert f[0] == pytest.approx(1 / 40) and f[38] == pytest.approx(39 / 40)
    assert f[40] == pytest.approx(0.1) and f[80] == pytest.approx(0.01)
