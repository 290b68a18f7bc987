"""The Lightning data module: GSV-Cities-style P x K training batches and retrieval validation."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import lightning.pytorch as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, default_collate

from aggzoo.data.grouped_images import GroupedImagesDataset
from aggzoo.data.image_policy import ImagePolicy
from aggzoo.data.retrieval_set import ImageListDataset, RetrievalSet
from aggzoo.data.transforms import Transform
from aggzoo.errors import ConfigError, UserError
from aggzoo.evaluation.options import ExtractionOptions
from aggzoo.training.clique_mining import (
    CliqueKeyedDataset,
    CliqueMiner,
    CliqueMiningOptions,
    CliquePlaceBatchSampler,
    clique_image_paths,
    collate_halves,
    describe_places,
    gsv_clique_inputs,
)
from aggzoo.training.samplers import EpochKeyedDataset, PlaceBatchSampler, ResumableDataLoader

__all__ = ["VPRDataModule", "PolicyImageDataset", "collate_readable"]


class PolicyImageDataset(Dataset):
    """Images read through an :class:`~aggzoo.data.image_policy.ImagePolicy`: ``index -> (image, index)``,
    or ``None`` for a file the policy skips (and lists); :func:`collate_readable` drops those."""

    def __init__(self, paths, transform: Transform, policy: ImagePolicy) -> None:
        self.paths = list(paths)
        self.transform = transform
        self.policy = policy

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int] | None:
        array = self.policy.read(self.paths[index])
        return None if array is None else (self.transform(array), index)


def collate_readable(batch: list) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``default_collate`` of the readable items of ``batch``; ``None`` when none is readable."""
    items = [item for item in batch if item is not None]
    return default_collate(items) if items else None


class VPRDataModule(L.LightningDataModule):
    """Batches of ``places_per_batch`` (P) places x K images for training; one loader per
    validation set over its database then its queries.

    Under DDP the P places of each step are split across the ranks (see
    :class:`~aggzoo.training.samplers.PlaceBatchSampler`) and each validation set is split by a
    non-shuffling :class:`~torch.utils.data.DistributedSampler` (the module gathers the
    descriptors back), so a run on W devices sees the data of a run on one.

    Args:
        train_dataset: the training places, or classes (:class:`~aggzoo.data.class_batches.ClassImagesDataset`:
            P classes x m images per step), its transform already set.
        val_sets: name -> retrieval set evaluated every epoch (may be empty).
        eval_transform: resize + normalise for validation and for feature sampling.
        places_per_batch: P, global over all devices (the recipe's batch size).
        num_workers: loader processes; 0 loads in the main process.
        eval_batch_size: images per validation batch (per device).
        seed: seeds the epoch permutations and every item's random draws.
        clique_mining: add a clique batch to every step (SALAD-CM, :mod:`aggzoo.training.clique_mining`);
            ``None`` (default): the P x K places only. The pool of clique batches is built when training
            starts (upstream builds it once per fit, in ``setup``), with the descriptors of the model
            of that moment, by rank 0 and broadcast to the other ranks; it is saved in every checkpoint
            (:meth:`state_dict`), so a resumed run reads the same batches.
    """

    def __init__(self, *, train_dataset: GroupedImagesDataset, val_sets: Mapping[str, RetrievalSet],
                 eval_transform: Transform, places_per_batch: int = 32, num_workers: int = 0,
                 eval_batch_size: int = 64, seed: int = 0, clique_mining: CliqueMiningOptions | None = None) -> None:
        super().__init__()
        if places_per_batch > len(train_dataset):
            raise ConfigError(f"data.places_per_batch={places_per_batch} exceeds the {len(train_dataset)} training "
                              f"places with enough images; lower it (e.g. data.places_per_batch={len(train_dataset)}) "
                              "or use more training data")
        self.train_dataset = train_dataset
        self.val_sets = dict(val_sets)
        self.eval_transform = eval_transform
        self.places_per_batch = places_per_batch
        self.num_workers = num_workers
        self.eval_batch_size = eval_batch_size
        self.seed = seed
        self.train_sampler: PlaceBatchSampler | None = None
        self.clique_mining = clique_mining
        #: ``[num_batches, P, K]`` image indices of the clique batches of this fit (``None``: not built yet)
        self.clique_pool: np.ndarray | None = None

    def _world(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)

    def _generator(self) -> torch.Generator:
        # The loader draws its workers' base seed from this, not from the global RNG, so creating an
        # iterator does not shift the training RNG stream (and resumed runs stay in step).
        return torch.Generator().manual_seed(self.seed)

    def train_batches_per_epoch(self) -> int:
        """Optimisation steps in a full epoch: the training places // P (the last partial global
        batch is dropped), the same on every rank."""
        return len(self.train_dataset) // self.places_per_batch

    def train_dataloader(self) -> DataLoader:
        world_size, rank = self._world()
        if self.clique_mining is not None:
            dataset, batch_size, collate = self._clique_sampling(world_size, rank)
        else:
            self.train_sampler = PlaceBatchSampler(len(self.train_dataset), places_per_batch=self.places_per_batch,
                                                   num_replicas=world_size, rank=rank, seed=self.seed)
            dataset, batch_size, collate = (EpochKeyedDataset(self.train_dataset, seed=self.seed),
                                            self.train_sampler.local_places, None)
        return ResumableDataLoader(dataset, batch_size=batch_size, sampler=self.train_sampler, collate_fn=collate,
                                   num_workers=self.num_workers, persistent_workers=self.num_workers > 0,
                                   pin_memory=torch.cuda.is_available(), generator=self._generator())

    # -- clique mining -----------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        if stage == "fit":  # a new fit builds a new pool (a resumed one gets its own back in load_state_dict)
            self.clique_pool = None

    def state_dict(self) -> dict[str, Any]:
        if self.clique_pool is None:
            return {}  # nothing stored: checkpoints without clique mining are as before
        return {"clique_pool": torch.from_numpy(self.clique_pool.astype(np.int64)),
                "clique_num_images": self.train_dataset.num_images}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "clique_pool" not in state or self.clique_mining is None:
            return
        if int(state["clique_num_images"]) != self.train_dataset.num_images:
            raise ConfigError(f"the checkpoint's clique batches index {state['clique_num_images']} training images, "
                              f"the training set now has {self.train_dataset.num_images}; resume with the same data")
        self.clique_pool = state["clique_pool"].numpy()

    def build_clique_pool(self) -> np.ndarray:
        """``[num_batches, P, K]`` clique batches: descriptors of one image per place by the descriptor model
        (the model being trained by default) on its device and at the trainer's precision, then mining."""
        options = self.clique_mining
        assert options is not None
        module = self.trainer.lightning_module
        model = options.descriptor_model() if options.descriptor_model is not None else module.model
        precision = {"16-mixed": "fp16", "bf16-mixed": "bf16"}.get(str(self.trainer.precision), "fp32")
        extraction = ExtractionOptions(batch_size=self.eval_batch_size, num_workers=self.num_workers,
                                       device=str(module.device), precision=precision)
        descriptors = describe_places(model, self.train_dataset, self.eval_transform, seed=self.seed,
                                      extraction=extraction)
        place_of_image, city_of_place, image_xy, _ = gsv_clique_inputs(self.train_dataset)
        miner = CliqueMiner(place_of_image, city_of_place, image_xy, descriptors,
                            places_per_batch=self.places_per_batch, images_per_place=self.train_dataset.img_per_place,
                            similar_places=options.similar_places, threshold=options.threshold)
        return miner.batches(options.num_batches, seed=self.seed, progress=None)

    def _clique_sampling(self, world_size: int, rank: int) -> tuple[Dataset, int, Callable]:
        """The clique batches' dataset, batch size (places and cliques) and collate function; sets
        :attr:`train_sampler`, mining the pool first when this fit has none."""
        assert self.clique_mining is not None
        if self.clique_pool is None:
            # Rank 0 builds, every rank receives the same pool (descriptors may differ in the last bit across
            # devices, and the sampling would then differ); the other ranks wait in the broadcast.
            # A user error on rank 0 (too few cliques) travels in the broadcast, so every rank stops with it.
            pool: Any = None
            if rank == 0:
                try:
                    pool = self.build_clique_pool()
                except UserError as err:
                    pool = err
            pool = self.trainer.strategy.broadcast(pool, src=0)
            if isinstance(pool, UserError):
                raise pool
            self.clique_pool = np.asarray(pool)
        self.train_sampler = CliquePlaceBatchSampler(
            len(self.train_dataset), pool=self.clique_pool, batches_per_epoch=self.clique_mining.batches_per_epoch,
            places_per_batch=self.places_per_batch, num_replicas=world_size, rank=rank, seed=self.seed)
        dataset = CliqueKeyedDataset(self.train_dataset, clique_image_paths(self.train_dataset), seed=self.seed)
        return dataset, 2 * self.train_sampler.local_places, collate_halves

    def _eval_loader(self, dataset: Dataset) -> DataLoader:
        world_size, rank = self._world()
        sampler = (DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=False)
                   if world_size > 1 else None)
        return DataLoader(dataset, batch_size=self.eval_batch_size, shuffle=False, sampler=sampler,
                          num_workers=self.num_workers, persistent_workers=self.num_workers > 0,
                          pin_memory=torch.cuda.is_available(), generator=self._generator())

    def val_dataloader(self) -> list[DataLoader]:
        return [self._eval_loader(ImageListDataset(list(s.image_paths), self.eval_transform))
                for s in self.val_sets.values()]

    def feature_sample_dataloader(self, num_images: int, *, seed: int = 0) -> DataLoader:
        """A loader over ``num_images`` random training images (eval transform), for the
        data-driven initialisation of heads (k-means, pooled).

        Images are read through the training set's ``bad_images`` policy: under ``skip`` an unreadable
        file is left out of its batch and listed with the other skipped training images (a batch of
        only unreadable files is ``None``); under ``fail`` it stops the job naming the file."""
        paths = [img.path for imgs in self.train_dataset.places.values() for img in imgs]
        rng = np.random.default_rng(seed)
        chosen = rng.choice(len(paths), size=min(num_images, len(paths)), replace=False)
        policy = getattr(self.train_dataset, "bad_images", None)
        dataset = (PolicyImageDataset([paths[i] for i in sorted(chosen)], self.eval_transform, policy)
                   if isinstance(policy, ImagePolicy) else
                   ImageListDataset([paths[i] for i in sorted(chosen)], self.eval_transform))
        return DataLoader(dataset, batch_size=self.eval_batch_size, num_workers=self.num_workers,
                          collate_fn=collate_readable, generator=self._generator())
