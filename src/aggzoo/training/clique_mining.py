"""Clique mining (SALAD-CM): training batches of geographically tight cliques of similar-looking places.

S. Izquierdo, J. Civera, "Close, But Not There: Boosting Geographic Distance Sensitivity in Visual Place
Recognition", ECCV 2024, arXiv:2407.02422. The procedure follows the paper's code (serizba/cliquemining,
``dataloaders/CliqueMapillaryDataset.py``; GPL-3.0: read for the procedure only, nothing copied).

One batch of ``P`` slots of ``K`` images is built city by city:

1. pick a city not yet used in this batch, with probability proportional to its number of places;
2. pick a random anchor place of that city, and ``similar`` (15) more places drawn without replacement
   with probability ``p_j ~ max_i d_i - d_j`` of their descriptor distance ``d_j`` to the anchor (the
   anchor, at distance 0, is never drawn; the farthest place has probability 0);
3. nodes = the images of those 16 places; an edge joins two images closer than ``threshold`` metres;
4. repeat: take the first maximal clique (``networkx.find_cliques``) with >= ``K`` images, sample ``K``
   of them as one slot, and remove every edge of those ``K`` images and of their neighbours (so no two
   slots of a batch are within ``threshold`` of each other); when no clique is left, go to step 1,
   until the batch has ``P`` slots.

Descriptors: one per place, of one random image of the place (the eval transform), computed by the
model of the moment the pool of batches is built. Upstream builds its pool once, when the data module is
set up for fitting (``GSVCitiesDataModule.setup`` constructs ``CliqueMapillaryDataset``): 4000 batches,
never rebuilt; before each epoch it permutes them and the epoch reads the first 2000. Its descriptors
come from a cached ``cluster_descriptors.npy`` or, failing that, the released DINOv2-SALAD of
``torch.hub`` (``serizba/salad``), not from the network being trained: here
``CliqueMiningOptions.descriptor_model`` names that model, and ``None`` takes the model being trained
(as it is at fit start, after the data-driven initialisation of its head).

Coordinates: upstream uses MSLS's UTM easting/northing; GSV-Cities gives latitude/longitude, which
:func:`local_metric_coordinates` projects onto a local plane per city (at 25 m the difference to UTM's
transverse Mercator is far below a metre). Upstream mines its cliques from MSLS train_val (panoramas
dropped, a place = an MSLS ``unique_cluster``); here they come from the GSV-Cities-layout training set
itself (a place = a GSV-Cities place), as no MSLS training reader exists.

Training (:class:`CliquePlaceBatchSampler`, :class:`CliqueKeyedDataset`, :func:`collate_halves`, fed by
:class:`~aggzoo.training.datamodule.VPRDataModule`): each step loads the usual ``P x K`` places and one
``P x K`` clique batch with the same transform; the training module puts both through one forward pass
and sums the metric loss of each half (upstream ``VPRModel.training_step``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import networkx
import numpy as np
import torch
from torch import nn
from torch.utils.data import default_collate

from aggzoo.data.gsv_cities import PLACE_ID_STRIDE, GSVCitiesDataset
from aggzoo.data.images import ImageReadError
from aggzoo.data.progress import progress_bar
from aggzoo.data.transforms import Transform
from aggzoo.errors import ConfigError, DatasetFormatError
from aggzoo.evaluation.extraction import extract_descriptors
from aggzoo.evaluation.options import ExtractionOptions
from aggzoo.training.samplers import EpochKeyedDataset, PlaceBatchSampler, sample_seed

__all__ = ["CliqueMiner", "CliqueMiningOptions", "CliqueKeyedDataset", "CliquePlaceBatchSampler", "collate_halves",
           "clique_image_paths", "describe_places", "gsv_clique_inputs", "local_metric_coordinates",
           "similar_place_probabilities"]

EARTH_RADIUS_M = 6_371_008.8  # mean Earth radius (IUGG)


def similar_place_probabilities(descriptors: np.ndarray, anchor: int) -> np.ndarray:
    """``[N]`` probabilities of drawing each place as similar to ``anchor``: ``(max d - d_j) / sum``, with
    ``d`` the Euclidean descriptor distances ``[N]`` to the anchor; places at distance 0 (the anchor) get 0.
    All zero when every other place is equally far (upstream divides by zero there); the miner then
    draws no similar place and mines the anchor's images alone.

    descriptors: ``[N, D]``, one per place.
    """
    d = np.linalg.norm(descriptors - descriptors[anchor], axis=1)
    weights = np.where(d != 0, d.max() - d, 0.0)
    total = weights.sum()
    return weights / total if total > 0 else weights


def local_metric_coordinates(lat_lon: np.ndarray) -> np.ndarray:
    """``[M, 2]`` degrees (lat, lon) -> ``[M, 2]`` metres (east, north) on the plane tangent at their mean
    latitude (equirectangular); distances of tens of metres match UTM's to well under 0.1%."""
    lat, lon = np.radians(lat_lon[:, 0]), np.radians(lat_lon[:, 1])
    east = EARTH_RADIUS_M * (lon - lon.mean()) * np.cos(lat.mean())
    north = EARTH_RADIUS_M * (lat - lat.mean())
    return np.stack([east, north], axis=1)


def _images_by_place(dataset: GSVCitiesDataset) -> Iterator[tuple[int, Any]]:
    """``(item index of the place, image record)`` over every image of the training places, in the one
    order the image indices of clique mining refer to."""
    for index, place_id in enumerate(dataset.place_ids):
        for image in dataset.places[int(place_id)]:
            yield index, image


def clique_image_paths(dataset: GSVCitiesDataset) -> list[Path]:
    """The image paths of :func:`gsv_clique_inputs` alone (what the clique batches' loader reads)."""
    return [image.path for _, image in _images_by_place(dataset)]


def gsv_clique_inputs(dataset: GSVCitiesDataset) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[Path]]:
    """What :class:`CliqueMiner` needs from a GSV-Cities training set, over all images of its places.

    Returns ``place_of_image [M]`` (the dataset's item index), ``city_of_place [N]``, ``image_xy [M, 2]``
    metres (one local plane per city) and the ``M`` image paths.
    """
    place_of_image, paths, lat_lon = [], [], []
    for index, image in _images_by_place(dataset):
        place_of_image.append(index)
        paths.append(image.path)
        lat_lon.append((image.lat, image.lon))
    coords = np.array(lat_lon, dtype=np.float64)
    if not np.isfinite(coords).all():
        raise DatasetFormatError(f"clique mining needs lat/lon for every image of {dataset.root / 'Dataframes'}; "
                                 "some rows have none")
    city_of_place = dataset.place_ids // PLACE_ID_STRIDE
    place_of_image = np.array(place_of_image)
    image_xy = np.zeros_like(coords)
    for city in np.unique(city_of_place):
        rows = city_of_place[place_of_image] == city
        image_xy[rows] = local_metric_coordinates(coords[rows])
    return place_of_image, city_of_place, image_xy, paths


class CliqueMiner:
    """Builds ``[P, K]`` batches of image indices by clique mining.

    Args:
        place_of_image: ``[M]`` place index of every image.
        city_of_place: ``[N]`` city index of every place.
        image_xy: ``[M, 2]`` metric coordinates of every image (one plane per city).
        descriptors: ``[N, D]`` one descriptor per place (the current model's).
        places_per_batch: ``P``; images_per_place: ``K`` (4); similar_places: 15; threshold: metres (25,
            the paper's ``main.py``).
    """

    def __init__(self, place_of_image: Sequence[int], city_of_place: Sequence[int], image_xy: np.ndarray,
                 descriptors: np.ndarray, *, places_per_batch: int, images_per_place: int = 4,
                 similar_places: int = 15, threshold: float = 25.0) -> None:
        self.place_of_image = np.asarray(place_of_image)
        self.city_of_place = np.asarray(city_of_place)
        self.image_xy = np.asarray(image_xy, dtype=np.float64)
        self.places_per_batch = places_per_batch
        self.images_per_place = images_per_place
        self.similar_places = similar_places
        self.threshold = threshold
        self.cities = np.unique(self.city_of_place)
        self.places_of_city = {int(c): np.flatnonzero(self.city_of_place == c) for c in self.cities}
        self.images_of_place = {int(p): np.flatnonzero(self.place_of_image == p) for p in range(len(self.city_of_place))}
        self.set_descriptors(descriptors)

    def set_descriptors(self, descriptors: np.ndarray) -> None:
        """Refresh the per-place descriptors ``[N, D]`` (e.g. with the current model, each epoch)."""
        descriptors = np.asarray(descriptors, dtype=np.float64)
        if descriptors.shape[0] != len(self.city_of_place):
            raise ConfigError(f"clique mining needs one descriptor per place: got {descriptors.shape[0]} for "
                              f"{len(self.city_of_place)} places")
        self.descriptors = descriptors

    def _city_slots(self, rng: np.random.Generator, city: int, wanted: int) -> list[np.ndarray]:
        """Up to ``wanted`` slots (``[K]`` image indices each) from one anchor of ``city``."""
        places = self.places_of_city[city]
        anchor = int(rng.integers(len(places)))
        probs = similar_place_probabilities(self.descriptors[places], anchor)
        count = min(self.similar_places, int((probs > 0).sum()))
        similar = rng.choice(len(places), size=count, replace=False, p=probs) if count else np.empty(0, int)
        chosen = np.concatenate([[anchor], similar])
        nodes = np.concatenate([self.images_of_place[int(places[i])] for i in chosen])
        xy = self.image_xy[nodes]
        adjacent = np.linalg.norm(xy[:, None] - xy[None], axis=-1) < self.threshold  # [n, n]
        np.fill_diagonal(adjacent, False)
        slots: list[np.ndarray] = []
        while len(slots) < wanted:
            clique = next((c for c in networkx.find_cliques(networkx.from_numpy_array(adjacent))
                           if len(c) >= self.images_per_place), None)
            if clique is None:
                break
            picked = rng.choice(sorted(clique), size=self.images_per_place, replace=False)
            neighbours = np.flatnonzero(adjacent[picked].any(axis=0))
            slots.append(nodes[picked])
            for cut in (picked, neighbours):  # the slot and its neighbours leave the graph
                adjacent[cut, :] = False
                adjacent[:, cut] = False
        return slots

    def batch(self, rng: np.random.Generator) -> np.ndarray:
        """One ``[P, K]`` batch of image indices."""
        sizes = np.array([len(self.places_of_city[int(c)]) for c in self.cities], dtype=np.float64)
        unused = np.ones(len(self.cities), dtype=bool)
        slots: list[np.ndarray] = []
        while len(slots) < self.places_per_batch:
            if not unused.any():
                raise ConfigError(f"clique mining found only {len(slots)} of data.places_per_batch="
                                  f"{self.places_per_batch} cliques of {self.images_per_place} images within "
                                  f"{self.threshold} m over all cities; lower places_per_batch or raise the threshold")
            p = np.where(unused, sizes, 0.0)
            city_index = int(rng.choice(len(self.cities), p=p / p.sum()))
            unused[city_index] = False
            slots += self._city_slots(rng, int(self.cities[city_index]), self.places_per_batch - len(slots))
        return np.stack(slots)

    def batches(self, num_batches: int, *, seed: int, epoch: int = 0, progress: bool | None = False) -> np.ndarray:
        """``[num_batches, P, K]`` image indices, a pure function of ``(seed, epoch)`` and the descriptors
        (``progress``: a bar over the batches, as :func:`~aggzoo.data.progress.progress_bar`)."""
        rng = np.random.default_rng((int(seed), int(epoch), 0xC11))
        with progress_bar(range(num_batches), progress, "clique batches", unit="batch") as steps:
            return np.stack([self.batch(rng) for _ in steps])


@dataclass(frozen=True)
class CliqueMiningOptions:
    """``data.clique_mining`` (``conf/data/clique_mining/default.yaml``); the defaults are upstream's.

    Args:
        num_batches: clique batches built in the pool (upstream ``num_batches`` 4000, built once per fit).
        batches_per_epoch: how many of the pool, freshly permuted, each epoch reads (upstream 2000, the
            length of its clique dataset); an epoch longer than that starts them over, as Lightning's
            ``max_size_cycle`` does upstream.
        similar_places: places drawn beside the anchor (15).
        threshold: metres; two images closer than this are one place (upstream ``main.py`` 25).
        descriptor_model: builds the model whose descriptors pick the similar places (upstream: the
            released DINOv2-SALAD); ``None``: the model being trained.
    """

    num_batches: int = 4000
    batches_per_epoch: int = 2000
    similar_places: int = 15
    threshold: float = 25.0
    descriptor_model: Callable[[], nn.Module] | None = None

    def __post_init__(self) -> None:
        for key in ("num_batches", "batches_per_epoch", "similar_places"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"data.clique_mining.{key} must be an integer >= 1, got {value!r}")
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, (int, float)) or not self.threshold > 0:
            raise ConfigError(f"data.clique_mining.threshold is in metres and must be > 0, got {self.threshold!r}")


def describe_places(model: nn.Module, dataset: GSVCitiesDataset, transform: Transform, *, seed: int,
                    extraction: ExtractionOptions = ExtractionOptions()) -> np.ndarray:
    """``[N, D]``: for every place of ``dataset`` the descriptor of one of its images, drawn from ``seed``
    (upstream: one random image per cluster), by :func:`~aggzoo.evaluation.extraction.extract_descriptors`
    with ``extraction`` (device, batch size, precision, progress)."""
    rng = np.random.default_rng((int(seed), 0xC11D))
    paths = [images[int(rng.integers(len(images)))].path
             for images in (dataset.places[int(p)] for p in dataset.place_ids)]
    return np.asarray(extract_descriptors(model, paths, transform, extraction, desc="clique descriptors"))


class CliquePlaceBatchSampler(PlaceBatchSampler):
    """:class:`~aggzoo.training.samplers.PlaceBatchSampler`'s keys for batch ``b``, then the keys of this
    rank's slots of one clique batch: a loader with ``batch_size = 2 * local_places`` yields both halves.

    Clique batch ``b`` of epoch ``e`` is ``pool[order_e[b % per_epoch]]``, ``order_e`` a permutation of the
    pool drawn from ``(seed, e)`` cut to ``per_epoch`` (upstream's ``reload()`` and dataset length). A clique
    key is ``(epoch, seed index, label, image indices)``: the label is the slot's position in the global
    batch (unique over ranks, as the gathered loss needs), the seed index keys its augmentation.
    Under DDP rank ``r`` takes slots ``r * P / W ... (r + 1) * P / W`` of the same pool, which every rank
    holds (the data module builds it on rank 0 and broadcasts it).
    """

    def __init__(self, num_places: int, *, pool: np.ndarray, batches_per_epoch: int, **kwargs: Any) -> None:
        super().__init__(num_places, **kwargs)
        pool = np.asarray(pool)
        if pool.ndim != 3 or pool.shape[1] != self.places_per_batch:
            raise ConfigError(f"the clique pool holds {pool.shape[1:2]} slots per batch for data.places_per_batch="
                              f"{self.places_per_batch}; rebuild it (start the run again without ckpt_path)")
        self.pool = pool
        self.per_epoch = min(int(batches_per_epoch), len(pool))

    def __len__(self) -> int:
        return 2 * super().__len__()

    def clique_order(self, epoch: int) -> np.ndarray:
        """``[per_epoch]`` pool rows read in ``epoch``, in order."""
        return np.random.default_rng((int(self.seed), int(epoch), 0xC11E)).permutation(len(self.pool))[: self.per_epoch]

    def clique_batch(self, epoch: int, batch: int) -> np.ndarray:
        """``[P, K]`` image indices of the clique half of global batch ``batch`` of ``epoch``."""
        return self.pool[self.clique_order(epoch)[batch % self.per_epoch]]

    def __iter__(self) -> Iterator[tuple]:
        epoch, places = self.epoch, iter(super().__iter__())
        lo, hi = self.rank * self.local_places, (self.rank + 1) * self.local_places
        order = self.clique_order(epoch)  # once per epoch, not per batch (clique_batch's rows)
        for batch in range(self.start_batch, self.num_batches):
            for _ in range(self.local_places):
                yield next(places)
            slots = self.pool[order[batch % self.per_epoch]]
            for slot in range(lo, hi):
                yield (epoch, self.num_places + batch * self.places_per_batch + slot, slot,
                       tuple(int(i) for i in slots[slot]))


class CliqueKeyedDataset(EpochKeyedDataset):
    """:class:`~aggzoo.training.samplers.EpochKeyedDataset` that also loads clique slots: a key
    ``(epoch, seed index, label, image indices)`` gives the ``K`` images ``[K, 3, H, W]`` (the training
    set's transform and ``bad_images`` policy; an unreadable one is replaced by another of its slot)
    and ``label`` repeated ``[K]``.

    Args:
        dataset: the training places (``GSVCitiesDataset``).
        image_paths: ``[M]`` paths of the image indices of the keys (:func:`gsv_clique_inputs`).
        seed: the run's seed.
    """

    def __init__(self, dataset: GSVCitiesDataset, image_paths: Sequence[Path], *, seed: int = 0) -> None:
        super().__init__(dataset, seed=seed)
        self.image_paths = list(image_paths)

    def __getitem__(self, key: tuple) -> Any:
        if len(key) == 2:
            return super().__getitem__(key)
        epoch, seed_index, label, images = key
        return self.seeded(epoch, sample_seed(self.seed, epoch, seed_index), lambda: self._slot(images, label))

    def _slot(self, images: Sequence[int], label: int) -> tuple[torch.Tensor, torch.Tensor]:
        paths = [self.image_paths[i] for i in images]
        arrays = [self.dataset.bad_images.read(path) for path in paths]
        readable = [a for a in arrays if a is not None]
        if not readable:
            raise ImageReadError(f"no image of a clique slot is readable: {[str(p) for p in paths]}")
        arrays = [a if a is not None else readable[i % len(readable)] for i, a in enumerate(arrays)]
        tensors = torch.stack([self.dataset.transform(a) for a in arrays])
        return tensors, torch.full((len(arrays),), int(label), dtype=torch.long)


def collate_halves(items: list) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """A :class:`CliquePlaceBatchSampler` batch -> ``{"places": (images [P, K, 3, H, W], labels [P, K]),
    "cliques": (the same for the clique slots)}``."""
    half = len(items) // 2
    return {"places": default_collate(items[:half]), "cliques": default_collate(items[half:])}
