"""NaN injected through a forward hook (and inf through a gradient hook): skipped and counted, or
stopped with the step, the batch and its files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as L
import pytest
import torch
from robust_helpers import TinyData, TinyModule, tiny_trainer, write_city

from aggzoo.training.guards import NonFiniteError, NonFiniteGuard


class Snapshots(L.Callback):
    """Parameters and Adam moments after every step."""

    def __init__(self) -> None:
        self.params: list[torch.Tensor] = []
        self.moments: list[torch.Tensor] = []

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self.params.append(torch.cat([p.detach().flatten().clone() for p in pl_module.parameters()]))
        state = trainer.optimizers[0].state
        self.moments.append(torch.cat([state[p]["exp_avg"].flatten().clone() for p in pl_module.parameters()
                                       if p in state]))


def _nan_at(module: TinyModule, calls: set[int]) -> None:
    counter = {"n": 0}

    def hook(mod: torch.nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
        counter["n"] += 1
        return output * float("nan") if counter["n"] - 1 in calls else output

    module.model.head.register_forward_hook(hook)


@pytest.fixture(scope="module")
def city(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("city")
    write_city(root, [3] * 8)
    return root


def test_skip_drops_the_step_and_counts_it(city: Path, tmp_path: Path) -> None:
    torch.manual_seed(0)
    module = TinyModule()
    _nan_at(module, {1})  # the forward of step 1 (batch 1)
    guard, snaps = NonFiniteGuard(policy="skip"), Snapshots()
    trainer = tiny_trainer(tmp_path, [guard, snaps], max_steps=4)
    trainer.fit(module, datamodule=TinyData(city))
    assert [s["step"] for s in guard.skipped] == [1] and guard.skipped[0]["loss_finite"] is False
    assert torch.equal(snaps.params[1], snaps.params[0])  # the skipped step changed no weight ...
    assert torch.equal(snaps.moments[1], snaps.moments[0])  # ... and no optimiser state
    assert not torch.equal(snaps.params[2], snaps.params[1])  # training went on
    assert all(bool(p.isfinite().all()) for p in snaps.params)
    assert trainer.callback_metrics["train/nonfinite_steps"] == 1.0


def test_stop_names_step_batch_and_files(city: Path, tmp_path: Path) -> None:
    module = TinyModule()
    _nan_at(module, {2})
    data = TinyData(city)
    trainer = tiny_trainer(tmp_path, [NonFiniteGuard(policy="stop")], max_steps=4)
    with pytest.raises(NonFiniteError) as info:
        trainer.fit(module, datamodule=data)
    message = str(info.value)
    assert message.startswith("non-finite loss (nan) at global step 2 (epoch 0, batch 2).")
    # Batch 2 holds places 4 and 5 (no shuffling, 2 places per batch): their drawn images.
    expected = [str(p) for index in (4, 5) for p in data.train_dataset.image_paths(index)]
    listing = tmp_path / "nonfinite_step2.txt"
    assert listing.read_text().split() == expected
    assert f"The batch's images (all 4 listed in {listing}): {', '.join(expected)}." in message
    assert "callbacks.non_finite.policy=skip" in message


def test_non_finite_gradient_with_finite_loss(city: Path, tmp_path: Path) -> None:
    module = TinyModule()
    calls = {"n": 0}

    def poison(grad: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        return grad * float("inf") if calls["n"] == 2 else grad

    module.model.head.bias.register_hook(poison)
    trainer = tiny_trainer(tmp_path, [NonFiniteGuard(policy="stop")], max_steps=4)
    with pytest.raises(NonFiniteError, match=r"^non-finite gradients in 1 parameters \(e\.g\. model\.head\.bias\) "
                                              r"at global step 1 \(epoch 0, batch 1\)"):
        trainer.fit(module, datamodule=TinyData(city))


def test_many_consecutive_skips_mean_divergence(city: Path, tmp_path: Path) -> None:
    module = TinyModule()
    _nan_at(module, set(range(100)))
    trainer = tiny_trainer(tmp_path, [NonFiniteGuard(policy="skip", max_consecutive=3)], max_steps=10)
    with pytest.raises(NonFiniteError, match=r"^3 consecutive training steps had a non-finite loss or gradients "
                                              r"\(last: global step 2 .*training has diverged"):
        trainer.fit(module, datamodule=TinyData(city))
    with pytest.raises(ValueError, match="policy must be one of"):
        NonFiniteGuard(policy="ignore")
