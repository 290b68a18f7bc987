"""P x K sampler: sharding across ranks, per-epoch determinism, mid-epoch resume; seeded items."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from aggzoo.data.transforms import train_transform
from aggzoo.training.samplers import EpochKeyedDataset, PlaceBatchSampler, ResumableDataLoader


def _batches(sampler: PlaceBatchSampler) -> list[list[tuple[int, int]]]:
    keys = list(sampler)
    return [keys[i:i + sampler.local_places] for i in range(0, len(keys), sampler.local_places)]


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_split_every_global_batch_into_the_single_process_batch(world: int) -> None:
    single = PlaceBatchSampler(50, places_per_batch=6, seed=3)
    single.set_epoch(4)
    shards = []
    for rank in range(world):
        sampler = PlaceBatchSampler(50, places_per_batch=6, num_replicas=world, rank=rank, seed=3)
        sampler.set_epoch(4)
        shards.append(_batches(sampler))
    reference = _batches(single)
    assert len(reference) == 50 // 6 and all(len(s) == len(reference) for s in shards)
    for b, batch in enumerate(reference):
        # rank-major concatenation == the single-process batch, in order (the loss gather relies on it)
        assert [key for shard in shards for key in shard[b]] == batch
    seen = [index for batch in reference for _, index in batch]
    assert len(set(seen)) == len(seen)  # a place at most once per epoch


def test_epochs_are_pure_functions_of_seed_and_epoch() -> None:
    a, b = PlaceBatchSampler(40, places_per_batch=4, seed=1), PlaceBatchSampler(40, places_per_batch=4, seed=1)
    a.set_epoch(2)
    b.set_epoch(5)
    b.set_epoch(2)
    assert list(a) == list(b)
    assert all(epoch == 2 for epoch, _ in a)
    a.set_epoch(3)
    assert [i for _, i in a] != [i for _, i in b]
    other_seed = PlaceBatchSampler(40, places_per_batch=4, seed=2)
    other_seed.set_epoch(2)
    assert [i for _, i in other_seed] != [i for _, i in b]


def test_mid_epoch_state_resumes_with_the_remaining_batches() -> None:
    run = PlaceBatchSampler(30, places_per_batch=5, seed=0)
    run.set_epoch(1)
    full = _batches(run)
    for _ in range(2):
        run.mark_batch_started(epoch_batches=len(full))
    state = run.state_dict()
    resumed = PlaceBatchSampler(30, places_per_batch=5, seed=0)
    resumed.load_state_dict(state)
    assert _batches(resumed) == full[2:]
    resumed.set_epoch(1)  # Lightning sets the (same) epoch again after restoring: no effect
    assert _batches(resumed) == full[2:]
    resumed.set_epoch(2)  # the next epoch starts from its first batch
    assert len(_batches(resumed)) == len(full)


def test_end_of_epoch_state_resumes_at_the_next_epoch() -> None:
    run = PlaceBatchSampler(30, places_per_batch=5, seed=0)
    run.set_epoch(1)
    for _ in range(2):  # limit_train_batches=2: the epoch ends after 2 of its 6 batches
        run.mark_batch_started(epoch_batches=2)
    resumed = PlaceBatchSampler(30, places_per_batch=5, seed=0)
    resumed.load_state_dict(run.state_dict())
    nxt = PlaceBatchSampler(30, places_per_batch=5, seed=0)
    nxt.set_epoch(2)
    assert resumed.epoch == 2 and _batches(resumed) == _batches(nxt)


def test_state_from_another_data_config_is_refused() -> None:
    run = PlaceBatchSampler(30, places_per_batch=5, seed=0)
    with pytest.raises(ValueError, match="places_per_batch: checkpoint 5 vs now 6"):
        PlaceBatchSampler(30, places_per_batch=6, seed=0).load_state_dict(run.state_dict())


def test_bad_batch_sizes_name_the_fix() -> None:
    with pytest.raises(ValueError, match="divisible by the 4 devices"):
        PlaceBatchSampler(30, places_per_batch=6, num_replicas=4)
    with pytest.raises(ValueError, match="exceeds the 5 training places"):
        PlaceBatchSampler(5, places_per_batch=6)


class _Noisy(Dataset):
    """Draws from every RNG the way transforms do, and records the epoch it was told."""

    def __init__(self) -> None:
        self.epoch = -1
        self.transform = train_transform((8, 8))

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return 10

    def __getitem__(self, index: int) -> tuple:
        image = (np.arange(16 * 16 * 3) % 251).astype(np.uint8).reshape(16, 16, 3)
        return (self.epoch, self.transform(image), torch.rand(2), float(np.random.rand()), random.random())


def _same(a: tuple, b: tuple) -> bool:
    return all(torch.equal(torch.as_tensor(x), torch.as_tensor(y)) for x, y in zip(a, b))


def test_items_depend_only_on_seed_epoch_index_and_leave_the_training_rng_alone() -> None:
    dataset = EpochKeyedDataset(_Noisy(), seed=7)
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    first = dataset[(3, 4)]
    _ = dataset[(0, 1)], dataset[(3, 5)]  # other items in between change nothing
    again = dataset[(3, 4)]
    assert first[0] == 3 and _same(first, again)
    assert not _same(first, dataset[(4, 4)]) and not _same(first, dataset[(3, 5)])
    assert not _same(first, EpochKeyedDataset(_Noisy(), seed=8)[(3, 4)])
    assert torch.equal(torch.rand(1), expected_next)  # the global torch stream did not move


def test_loader_batches_do_not_depend_on_the_number_of_workers() -> None:
    def collect(workers: int) -> list[torch.Tensor]:
        sampler = PlaceBatchSampler(10, places_per_batch=2, seed=0)
        loader = ResumableDataLoader(EpochKeyedDataset(_Noisy(), seed=0), batch_size=2, sampler=sampler,
                                     num_workers=workers, generator=torch.Generator().manual_seed(0))
        return [batch[1] for batch in loader]

    assert all(torch.equal(a, b) for a, b in zip(collect(0), collect(2), strict=True))
