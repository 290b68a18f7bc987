"""P x K training batches that shard places across ranks, are a pure function of ``(seed, epoch)``,
and resume in the middle of an epoch.

Three pieces work together:

- :class:`PlaceBatchSampler` orders the places of an epoch with a permutation drawn from
  ``(seed, epoch)``, cuts it into global batches of ``P`` places and gives each of the ``W`` ranks
  a contiguous ``P / W`` slice of every global batch. The union over ranks of batch ``b`` is the
  single-process batch ``b``, so a run on ``W`` devices sees exactly the data of a run on one.
  It yields keys ``(epoch, place index)`` rather than bare indices, so every loader worker knows
  the epoch of the item it loads (``set_epoch`` on the dataset in the main process does not
  reach persistent workers).
- :class:`EpochKeyedDataset` loads ``dataset[(epoch, index)]`` with every random draw seeded from
  ``(seed, epoch, index)``: the dataset's per-epoch image choice (``set_epoch``) and the
  augmentation (albumentations' own generators and the global torch / numpy / python RNGs, forked
  so the training RNG is untouched). An item is therefore the same whatever the number of
  workers, ranks or interruptions.
- :class:`ResumableDataLoader` exposes the sampler's position as ``state_dict`` /
  ``load_state_dict``, which Lightning stores in the checkpoint (``loops.fit_loop.state_dict.
  combined_loader``) and restores before it iterates again. The position counts the batches the
  training step *consumed* (:meth:`PlaceBatchSampler.mark_batch_started`, called by the training
  module), not the batches the loader prefetched.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from aggzoo.errors import ConfigError

__all__ = ["PlaceBatchSampler", "EpochKeyedDataset", "ResumableDataLoader", "seed_transform", "sample_seed"]


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """A 32-bit seed that is a pure function of ``(seed, epoch, index)``."""
    return int(np.random.SeedSequence((int(seed), int(epoch), int(index), 0xA6)).generate_state(1)[0])


def seed_transform(transform: Any, seed: int) -> bool:
    """Reseed a transform's private generators (albumentations ``Compose.set_random_seed``, found
    on the transform itself or on its ``compose`` attribute). Returns whether one was found."""
    for candidate in (transform, getattr(transform, "compose", None)):
        set_seed = getattr(candidate, "set_random_seed", None)
        if callable(set_seed):
            set_seed(seed)
            return True
    return False


class PlaceBatchSampler(DistributedSampler):
    """Keys ``(epoch, place index)`` for ``P / W`` places per batch on each of ``W`` ranks.

    Subclassing :class:`~torch.utils.data.DistributedSampler` tells Lightning that the data is
    already sharded (it then leaves the sampler alone under DDP) and lets it call
    :meth:`set_epoch` at every epoch start.

    Args:
        num_places: places in the training set.
        places_per_batch: ``P``, the *global* number of places per optimisation step (the
            recipe's batch size); each rank loads ``P / W`` of them.
        num_replicas, rank: ``W`` and this process's rank.
        seed: the permutation of epoch ``e`` is drawn from ``(seed, e)``.
        shuffle: permute the places each epoch (else keep their order).

    One epoch has ``num_places // P`` batches (the incomplete last global batch is dropped: too
    few places for the miner to find negatives).
    """

    def __init__(self, num_places: int, *, places_per_batch: int, num_replicas: int = 1, rank: int = 0,
                 seed: int = 0, shuffle: bool = True) -> None:
        if places_per_batch < 2:
            raise ConfigError("data.places_per_batch must be >= 2 (negatives come from other places), "
                              f"got {places_per_batch}; e.g. data.places_per_batch=32")
        if places_per_batch > num_places:
            raise ConfigError(f"data.places_per_batch={places_per_batch} exceeds the {num_places} training places; "
                              f"lower it (e.g. data.places_per_batch={num_places})")
        if places_per_batch % num_replicas:
            raise ConfigError(f"data.places_per_batch={places_per_batch} (the global P) must be divisible by the "
                              f"{num_replicas} devices x nodes, so that each rank loads the same number of places; "
                              f"e.g. data.places_per_batch={max(num_replicas, places_per_batch // num_replicas * num_replicas)}")
        super().__init__(range(num_places), num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed)
        self.num_places = num_places
        self.places_per_batch = places_per_batch
        self.local_places = places_per_batch // num_replicas
        self.num_batches = num_places // places_per_batch
        self.start_batch = 0  # first batch the next iterator yields (mid-epoch resume)
        self.batches_done = 0  # batches of this epoch consumed by training steps
        self.epoch_batches = self.num_batches  # batches the trainer runs per epoch (limit_train_batches)

    def __len__(self) -> int:
        return self.num_batches * self.local_places

    def epoch_permutation(self, epoch: int) -> np.ndarray:
        """The global order of the places in ``epoch``."""
        if not self.shuffle:
            return np.arange(self.num_places)
        return np.random.default_rng((int(self.seed), int(epoch))).permutation(self.num_places)

    def global_batches(self, epoch: int) -> np.ndarray:
        """``[num_batches, P]`` place indices of every global batch of ``epoch``."""
        order = self.epoch_permutation(epoch)
        return order[: self.num_batches * self.places_per_batch].reshape(self.num_batches, self.places_per_batch)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch, start = self.epoch, self.start_batch
        local = self.global_batches(epoch)[:, self.rank * self.local_places:(self.rank + 1) * self.local_places]
        for batch in local[start:]:
            for index in batch:
                yield epoch, int(index)

    def set_epoch(self, epoch: int) -> None:
        if int(epoch) != self.epoch:
            self.epoch = int(epoch)
            self.start_batch = 0
            self.batches_done = 0

    def mark_batch_started(self, epoch_batches: int | float | None = None) -> None:
        """Count one consumed batch (the training module calls this before each step).
        ``epoch_batches``: the trainer's batches per epoch, when it limits them."""
        self.batches_done += 1
        if epoch_batches is not None and epoch_batches != float("inf"):
            self.epoch_batches = int(epoch_batches)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "batches_done": self.batches_done, "epoch_batches": self.epoch_batches,
                "seed": int(self.seed), "num_places": self.num_places, "places_per_batch": self.places_per_batch,
                "shuffle": bool(self.shuffle)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        recorded = {k: state[k] for k in ("seed", "num_places", "places_per_batch", "shuffle") if k in state}
        current = {"seed": int(self.seed), "num_places": self.num_places,
                   "places_per_batch": self.places_per_batch, "shuffle": bool(self.shuffle)}
        changed = {k: (v, current[k]) for k, v in recorded.items() if v != current[k]}
        if changed:
            detail = ", ".join(f"{k}: checkpoint {a} vs now {b}" for k, (a, b) in changed.items())
            raise ValueError(f"the checkpoint's training data order does not match this run ({detail}); resume with "
                             "the same seed and data config, or start a new run without ckpt_path")
        epoch, done = int(state["epoch"]), int(state["batches_done"])
        if done >= int(state.get("epoch_batches", self.num_batches)):
            epoch, done = epoch + 1, 0  # saved at the end of an epoch: the next one starts afresh
        self.epoch, self.start_batch, self.batches_done = epoch, done, done
        self.epoch_batches = int(state.get("epoch_batches", self.num_batches))


class EpochKeyedDataset(Dataset):
    """``dataset[(epoch, index)]`` with all randomness drawn from ``(seed, epoch, index)``.

    Args:
        dataset: a map-style dataset; its ``set_epoch(epoch)`` is called when it has one, and its
            ``transform`` reseeded (see :func:`seed_transform`).
        seed: the run's seed.
    """

    def __init__(self, dataset: Dataset, *, seed: int = 0) -> None:
        self.dataset = dataset
        self.seed = int(seed)

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, key: tuple[int, int]) -> Any:
        epoch, index = key
        return self.seeded(epoch, sample_seed(self.seed, epoch, index), lambda: self.dataset[index])

    def seeded(self, epoch: int, item_seed: int, load: Callable[[], Any]) -> Any:
        """``load()`` with the dataset at ``epoch`` and every random draw seeded from ``item_seed``."""
        set_epoch = getattr(self.dataset, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)
        seed_transform(getattr(self.dataset, "transform", None), item_seed)
        # Transforms drawing from the global RNGs (torchvision, custom code) get them seeded too,
        # inside a fork so the training process's own RNG stream (dropout, ...) is not disturbed.
        py_state, np_state = random.getstate(), np.random.get_state()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(item_seed)
            random.seed(item_seed)
            np.random.seed(item_seed)
            try:
                return load()
            finally:
                random.setstate(py_state)
                np.random.set_state(np_state)


class ResumableDataLoader(DataLoader):
    """A :class:`~torch.utils.data.DataLoader` whose sampler position is saved in Lightning
    checkpoints (Lightning calls ``state_dict`` / ``load_state_dict`` on stateful loaders)."""

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)
