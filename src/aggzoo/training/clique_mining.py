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

Descriptors are those of one image per place computed by the current model; the caller refreshes them
(:meth:`CliqueMiner.set_descriptors`; upstream computes them when it prebuilds its 4000 batches, i.e.
with the model of that moment). Coordinates: upstream uses MSLS's UTM easting/northing; GSV-Cities gives
latitude/longitude, which :func:`local_metric_coordinates` projects onto a local plane per city (at
25 m the difference to UTM's transverse Mercator is far below a metre).

Not done here: the data module / config option that feeds these batches to training (see the report
of issue 13 item 5).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import networkx
import numpy as np

from aggzoo.data.gsv_cities import PLACE_ID_STRIDE, GSVCitiesDataset
from aggzoo.errors import ConfigError, DatasetFormatError

__all__ = ["CliqueMiner", "gsv_clique_inputs", "local_metric_coordinates", "similar_place_probabilities"]

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


def gsv_clique_inputs(dataset: GSVCitiesDataset) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[Path]]:
    """What :class:`CliqueMiner` needs from a GSV-Cities training set, over all images of its places.

    Returns ``place_of_image [M]`` (the dataset's item index), ``city_of_place [N]``, ``image_xy [M, 2]``
    metres (one local plane per city) and the ``M`` image paths.
    """
    place_of_image, paths, lat_lon = [], [], []
    for index, place_id in enumerate(dataset.place_ids):
        for image in dataset.places[int(place_id)]:
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

    def batches(self, num_batches: int, *, seed: int, epoch: int = 0) -> np.ndarray:
        """``[num_batches, P, K]`` image indices, a pure function of ``(seed, epoch)`` and the descriptors."""
        rng = np.random.default_rng((int(seed), int(epoch), 0xC11))
        return np.stack([self.batch(rng) for _ in range(num_batches)])
