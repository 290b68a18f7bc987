"""Clique mining as a training option (``data/clique_mining=default``), with the real Lightning Trainer on the
tiny synthetic city: every step holds the usual places and a clique batch whose slots are cliques under the
threshold and apart from each other (found by brute force over the real latitudes/longitudes of the images
the batch tensors are), the pool is built once per fit with the model of that moment (upstream), each rank
of a DDP run takes its slice of the same pool, and with the option off nothing changes."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import lightning.pytorch as L
import numpy as np
import pytest
import torch
from train_helpers import TINY, compose_train

from aggzoo.data.images import read_rgb
from aggzoo.errors import ConfigError
from aggzoo.hub.builder import build_model
from aggzoo.run.pipeline import build_training
from aggzoo.training.clique_mining import CliquePlaceBatchSampler
from aggzoo.training.datamodule import VPRDataModule
from aggzoo.training.samplers import EpochKeyedDataset, PlaceBatchSampler

P, STEPS, EPOCHS, THRESHOLD = 4, 2, 2, 25.0
SIZE = [48, 64]
COMMON = [*TINY, "head=gem", "data.places_per_batch=4", "data.num_workers=0", "benchmark@val_benchmarks=[]",
          "benchmark@test_benchmarks=[]", "evaluate_baseline=false"]
CLIQUES = ["data/clique_mining=default", "data.clique_mining.num_batches=3", "data.clique_mining.batches_per_epoch=2"]


def _haversine(a: tuple[float, float], b: tuple[float, float]) -> float:
    """Metres between two (lat, lon) in degrees on the mean Earth sphere."""
    (la1, lo1), (la2, lo2) = (tuple(math.radians(v) for v in p) for p in (a, b))
    h = math.sin((la2 - la1) / 2) ** 2 + math.cos(la1) * math.cos(la2) * math.sin((lo2 - lo1) / 2) ** 2
    return 2 * 6_371_008.8 * math.asin(math.sqrt(h))


class _Record(L.Callback):
    """Keeps each step's clique half and the model as it was when training started."""

    def __init__(self) -> None:
        self.cliques: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.places: list[torch.Tensor] = []
        self.start_state: dict[str, torch.Tensor] = {}

    def on_train_start(self, trainer, pl_module) -> None:
        self.start_state = copy.deepcopy(pl_module.model.state_dict())

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.cliques.append((batch["cliques"][0].cpu().clone(), batch["cliques"][1].cpu().clone()))
        self.places.append(batch["places"][0].cpu().clone())


def _parts(overrides: list[str], tmp_path: Path):
    L.seed_everything(0, verbose=False)
    parts = build_training(compose_train([*COMMON, *overrides], tmp_path))
    # A deterministic train transform, so that every image of a batch can be told apart by its pixels.
    parts.datamodule.train_dataset.transform = parts.datamodule.eval_transform
    return parts


def _trainer(tmp_path: Path, callbacks: list) -> L.Trainer:
    return L.Trainer(accelerator="cpu", devices=1, max_epochs=EPOCHS, limit_train_batches=STEPS, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                     num_sanity_val_steps=0, limit_val_batches=0, callbacks=callbacks, default_root_dir=tmp_path)


@pytest.fixture(scope="module")
def clique_run(tiny_data, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("clique_run")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AGGZOO_DATA", str(tiny_data.root))
        parts = _parts(CLIQUES, tmp_path)
        record = _Record()
        builds: list[np.ndarray] = []
        build = parts.datamodule.build_clique_pool
        parts.datamodule.build_clique_pool = lambda: builds.append(build()) or builds[-1]
        before = {k: v.clone() for k, v in parts.model.state_dict().items()}
        trainer = _trainer(tmp_path, [record])
        trainer.fit(parts.module, datamodule=parts.datamodule)
    return parts, trainer, record, builds, before


def test_training_with_clique_mining_runs_both_halves(clique_run) -> None:
    parts, trainer, record, _, before = clique_run
    assert trainer.global_step == STEPS * EPOCHS
    metrics = trainer.callback_metrics
    assert torch.isfinite(metrics["train/loss"])
    # the logged loss is the sum of the two halves' losses (one forward pass, one loss each)
    torch.testing.assert_close(metrics["train/loss"], metrics["train/place_loss"] + metrics["train/clique_loss"])
    after = parts.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before if before[k].is_floating_point())
    k = parts.datamodule.train_dataset.img_per_place
    for images, labels in record.cliques:
        assert images.shape == (P, k, 3, *SIZE)
        np.testing.assert_array_equal(labels.numpy(), np.repeat(np.arange(P)[:, None], k, axis=1))


def test_clique_halves_are_cliques_apart_on_the_real_coordinates(clique_run) -> None:
    parts, _, record, _, _ = clique_run
    dataset = parts.datamodule.train_dataset
    images = [img for place in dataset.place_ids for img in dataset.places[int(place)]]
    pixels = torch.stack([dataset.transform(read_rgb(img.path)) for img in images]).flatten(1)  # [M, HW3]
    for batch, _ in record.cliques:
        flat = batch.flatten(2)  # [P, K, HW3]
        # which file each image of the batch is: the one with identical pixels (and only that one)
        same = (flat[:, :, None] == pixels[None, None]).all(-1)  # [P, K, M]
        assert (same.sum(-1) == 1).all()
        which = same.int().argmax(-1)
        assert len(torch.unique(which)) == which.numel()  # P x K distinct images
        where = [[(images[i].lat, images[i].lon) for i in slot] for slot in which.tolist()]
        for s, slot in enumerate(where):
            assert all(_haversine(a, b) < THRESHOLD for i, a in enumerate(slot) for b in slot[i + 1:])
            for other in where[s + 1:]:
                assert all(_haversine(a, b) >= THRESHOLD for a in slot for b in other)


def test_the_pool_is_built_once_per_fit_with_the_model_of_that_moment(clique_run, tmp_path: Path) -> None:
    parts, trainer, record, builds, _ = clique_run
    datamodule = parts.datamodule
    assert len(builds) == 1 and datamodule.clique_pool is builds[0]  # not rebuilt at the second epoch
    assert datamodule.clique_pool.shape == (3, P, datamodule.train_dataset.img_per_place)
    sampler = datamodule.train_sampler
    assert isinstance(sampler, CliquePlaceBatchSampler)
    epoch_rows = [set(sampler.clique_order(e).tolist()) for e in range(EPOCHS)]
    assert all(len(rows) == 2 for rows in epoch_rows)  # batches_per_epoch of the 3, freshly permuted
    # The pool is a pure function of the model it was mined with: the model at the start of the fit
    # gives it again.
    trained = parts.model.state_dict()
    parts.module.model.load_state_dict(record.start_state)
    np.testing.assert_array_equal(VPRDataModule.build_clique_pool(datamodule), datamodule.clique_pool)
    parts.module.model.load_state_dict(trained)
    # a checkpoint keeps the pool, so a resumed run reads the same batches
    state = datamodule.state_dict()
    datamodule.clique_pool = None
    datamodule.load_state_dict(state)
    np.testing.assert_array_equal(datamodule.clique_pool, builds[0])
    # A new fit mines again, with the model of that moment: after a model change (another initialisation
    # of the same architecture) its batches differ.
    torch.manual_seed(123)
    parts.module.model.load_state_dict(build_model(parts.model.aggzoo_spec).state_dict())
    trainer = _trainer(tmp_path, [])
    trainer.fit_loop.max_epochs, trainer.limit_train_batches = 1, 1
    trainer.fit(parts.module, datamodule=datamodule)
    assert len(builds) == 2 and datamodule.clique_pool is builds[1]
    assert not np.array_equal(builds[1], builds[0])


def test_ranks_take_their_slice_of_the_same_clique_batches() -> None:
    pool = np.arange(5 * 4 * 2).reshape(5, 4, 2)
    single = CliquePlaceBatchSampler(12, pool=pool, batches_per_epoch=3, places_per_batch=4, seed=1)
    ranks = [CliquePlaceBatchSampler(12, pool=pool, batches_per_epoch=3, places_per_batch=4, seed=1,
                                     num_replicas=2, rank=r) for r in range(2)]
    for sampler in (single, *ranks):
        sampler.set_epoch(1)
    keys = list(single)
    assert len(keys) == len(single) == 3 * 2 * 4  # 3 batches of 4 places then 4 slots
    per_rank = [list(s) for s in ranks]
    for b in range(3):
        one = keys[b * 8:(b + 1) * 8]
        two = [k for r in per_rank for k in r[b * 4:(b + 1) * 4]]
        assert [k for k in two if len(k) == 2] == one[:4] and [k for k in two if len(k) == 4] == one[4:]
        assert [k[2] for k in one[4:]] == [0, 1, 2, 3]  # labels: the slot's place in the global batch
        np.testing.assert_array_equal([k[3] for k in one[4:]], single.clique_batch(1, b))
    # an epoch longer than batches_per_epoch starts its batches over (upstream's max_size_cycle)
    np.testing.assert_array_equal(single.clique_batch(1, 3), single.clique_batch(1, 0))


def test_option_off_is_the_one_batch_path(tiny_data, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGGZOO_DATA", str(tiny_data.root))
    assert "clique_mining" not in compose_train(COMMON, tmp_path).data
    off, on = _parts([], tmp_path / "off"), _parts(CLIQUES, tmp_path / "on")
    assert off.datamodule.clique_mining is None and off.datamodule.state_dict() == {}
    loader = off.datamodule.train_dataloader()
    assert type(loader.sampler) is PlaceBatchSampler and type(loader.dataset) is EpochKeyedDataset
    on.datamodule.clique_pool = np.zeros((1, P, 4), dtype=np.int64)  # the places half does not depend on it
    on_batches = iter(on.datamodule.train_dataloader())
    for images, labels in list(loader)[:2]:  # the places half of a clique step is the batch of the plain run
        both = next(on_batches)
        assert torch.equal(both["places"][0], images) and torch.equal(both["places"][1], labels)
    # the one-batch step is the metric loss of the model's descriptors, as before
    images, labels = next(iter(loader))
    off.module.gather_loss = False  # no trainer here (one process: the gather is a no-op anyway)
    off.model.eval()  # the same batch-norm statistics for both forward passes
    expected = off.module.loss(off.model(images.flatten(0, 1)), labels.flatten())
    with pytest.warns(UserWarning, match="self.log"):  # logging needs a running trainer
        loss = off.module.training_step((images, labels), 0)
    torch.testing.assert_close(loss, expected, rtol=0, atol=0)


def test_bad_clique_options_are_one_clear_error(tiny_data, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGGZOO_DATA", str(tiny_data.root))
    with pytest.raises(ConfigError, match="data.clique_mining.threshold"):
        build_training(compose_train([*COMMON, *CLIQUES, "data.clique_mining.threshold=0"], tmp_path))
    with pytest.raises(ConfigError, match="data.clique_mining.radius is not an option"):
        build_training(compose_train([*COMMON, *CLIQUES, "+data.clique_mining.radius=3"], tmp_path))
