"""Ctrl-C during training: Lightning's own behaviour, then GracefulInterrupt's (finish the step,
save, stop with status 130), with loader workers that receive the terminal's SIGINT too; SIGTERM
saves the same way. (A real Ctrl-C to ``python train.py``: tests/training/test_ctrl_c_resume.py.)"""

from __future__ import annotations

import multiprocessing
import os
import signal
from pathlib import Path
from typing import Any

import lightning.pytorch as L
import pytest
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException
from robust_helpers import TinyData, TinyModule, tiny_trainer, write_city

from aggzoo.training.interrupt import GracefulInterrupt, StoppedByCtrlC


class CtrlC(L.Callback):
    """Sends SIGINT, as a terminal does, to this process and its loader workers at a given step."""

    def __init__(self, at_step: int, times: int = 1) -> None:
        self.at_step, self.times = at_step, times

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.at_step:
            for child in multiprocessing.active_children():
                os.kill(child.pid, signal.SIGINT)
            for _ in range(self.times):
                os.kill(os.getpid(), signal.SIGINT)


@pytest.fixture(scope="module")
def city(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("city")
    write_city(root, [2] * 12)
    return root


@pytest.fixture(autouse=True)
def restore_sigint() -> Any:
    yield
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Lightning leaves SIG_IGN behind


def test_lightning_alone_exits_without_saving(city: Path, tmp_path: Path) -> None:
    trainer = tiny_trainer(tmp_path, [CtrlC(at_step=2)], max_steps=5)
    with pytest.raises(SystemExit):
        trainer.fit(TinyModule(), datamodule=TinyData(city))
    assert not list(tmp_path.rglob("*.ckpt"))


def test_first_ctrl_c_finishes_the_step_saves_and_stops(city: Path, tmp_path: Path) -> None:
    interrupt = GracefulInterrupt()
    module = TinyModule()
    # CtrlC runs before GracefulInterrupt at the same batch end: the step that received the signal
    # is the last one, and its result is what gets saved.
    trainer = tiny_trainer(tmp_path, [CtrlC(at_step=2), interrupt], max_steps=5)
    with pytest.raises(StoppedByCtrlC) as stop:  # mid-epoch: stopped before Lightning's end-of-step work
        trainer.fit(module, datamodule=TinyData(city, num_workers=2))
    assert stop.value.code == 130
    assert trainer.global_step == 2 and interrupt.requested
    assert interrupt.saved_path == tmp_path / "interrupted.ckpt"
    checkpoint = torch.load(interrupt.saved_path, weights_only=True)
    assert checkpoint["global_step"] == 2
    for name, value in module.state_dict().items():
        assert torch.equal(checkpoint["state_dict"][name], value)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handler restored


class TermDuringStep(L.Callback):
    """Sends SIGTERM to this process while the step that completes global step ``at_step`` runs."""

    def __init__(self, at_step: int) -> None:
        self.at_step = at_step

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.at_step - 1:
            os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_during_a_step_saves_that_step_before_lightning_stops(city: Path, tmp_path: Path) -> None:
    interrupt = GracefulInterrupt()
    module = TinyModule()
    trainer = tiny_trainer(tmp_path, [TermDuringStep(at_step=2), interrupt], max_steps=5)
    with pytest.raises(SIGTERMException):  # Lightning's own stop, after the step (exit status 0 by itself)
        trainer.fit(module, datamodule=TinyData(city))
    assert trainer.global_step == 2 and interrupt.saved_path == tmp_path / "interrupted.ckpt"
    checkpoint = torch.load(interrupt.saved_path, weights_only=True)
    assert checkpoint["global_step"] == 2
    for name, value in module.state_dict().items():
        assert torch.equal(checkpoint["state_dict"][name], value)


def test_second_ctrl_c_aborts_at_once(city: Path, tmp_path: Path) -> None:
    interrupt = GracefulInterrupt()
    trainer = tiny_trainer(tmp_path, [CtrlC(at_step=1, times=2), interrupt], max_steps=5)
    with pytest.raises(SystemExit):
        trainer.fit(TinyModule(), datamodule=TinyData(city))
    assert interrupt.saved_path is None and not list(tmp_path.rglob("*.ckpt"))


def test_loader_workers_ignore_sigint_and_keep_their_own_init(city: Path, tmp_path: Path) -> None:
    # Under fork, workers also inherit the handler (which ignores signals outside the main
    # process); under spawn/forkserver only the chained worker_init_fn protects them.
    calls: list[int] = []
    data = TinyData(city, num_workers=2)
    loader = data.train_dataloader()
    loader.worker_init_fn = calls.append
    data.train_dataloader = lambda: loader  # type: ignore[method-assign]
    trainer = tiny_trainer(tmp_path, [GracefulInterrupt()], max_steps=1)
    trainer.fit(TinyModule(), datamodule=data)
    chained = loader.worker_init_fn
    assert type(chained).__name__ == "_ChainedInit" and chained.inner == calls.append
    previous = signal.getsignal(signal.SIGINT)
    try:
        chained(7)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN and calls == [7]
    finally:
        signal.signal(signal.SIGINT, previous)


def test_state_goes_to_last_ckpt_when_checkpointing_keeps_one(city: Path, tmp_path: Path) -> None:
    from lightning.pytorch.callbacks import ModelCheckpoint

    interrupt = GracefulInterrupt()
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "checkpoints", save_last=True, save_top_k=0)
    trainer = tiny_trainer(tmp_path, [CtrlC(at_step=3), interrupt, checkpoints], max_steps=5,
                           enable_checkpointing=True)
    with pytest.raises(StoppedByCtrlC):
        trainer.fit(TinyModule(), datamodule=TinyData(city))
    assert interrupt.saved_path == tmp_path / "checkpoints" / "last.ckpt"
    state = torch.load(interrupt.saved_path, weights_only=True)
    assert state["global_step"] == 3  # ckpt_path=last resumes here
    # Recorded as ModelCheckpoint's own last file: the resumed run refreshes it, no last-v1.ckpt.
    (key,) = [k for k in state["callbacks"] if k.startswith("ModelCheckpoint")]
    assert state["callbacks"][key]["last_model_path"] == str(interrupt.saved_path)


def test_ctrl_c_in_the_last_step_of_an_epoch_completes_the_epoch(city: Path, tmp_path: Path) -> None:
    # 12 places / 2 per batch: step 6 ends epoch 0. That epoch is whole, so it ends as usual (its
    # epoch-end hooks, validation and checkpoints run) and is saved at its end; no exception.
    interrupt = GracefulInterrupt()
    trainer = tiny_trainer(tmp_path, [CtrlC(at_step=6), interrupt], max_epochs=3)
    trainer.fit(TinyModule(), datamodule=TinyData(city))
    assert trainer.global_step == 6 and trainer.current_epoch == 1  # stopped after epoch 0
    state = torch.load(interrupt.saved_path, weights_only=True)
    assert state["global_step"] == 6 and state["epoch"] == 0
    assert state["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]["completed"] == 6
