"""Clique mining: every batch is P x K distinct images, every slot is a clique under the threshold (brute
force over pairwise distances), slots of a batch are apart, seeded determinism, the probability rule on a
hand-made example and the metric projection against the haversine distance."""

from __future__ import annotations

import math

import numpy as np
import pytest

from aggzoo.errors import ConfigError
from aggzoo.training.clique_mining import CliqueMiner, local_metric_coordinates, similar_place_probabilities

P, K, THRESHOLD = 6, 4, 25.0


def _cities(seed: int = 0, cities: int = 3, places: int = 30, images: int = 5) -> CliqueMiner:
    """Places on a 60 m grid, their images scattered 0-15 m around them: cliques span neighbouring places."""
    rng = np.random.default_rng(seed)
    place_of_image, city_of_place, xy = [], [], []
    for city in range(cities):
        for p in range(places):
            centre = np.array([(p % 6) * 30.0, (p // 6) * 30.0])
            index = len(city_of_place)
            city_of_place.append(city)
            for _ in range(images):
                place_of_image.append(index)
                xy.append(centre + rng.uniform(-8, 8, size=2))
    descriptors = rng.normal(size=(len(city_of_place), 8))
    return CliqueMiner(place_of_image, city_of_place, np.array(xy), descriptors, places_per_batch=P,
                       images_per_place=K, threshold=THRESHOLD)


def test_every_batch_is_p_by_k_cliques_of_distinct_images_apart_from_each_other() -> None:
    miner = _cities()
    batches = miner.batches(5, seed=0)
    assert batches.shape == (5, P, K)
    for batch in batches:
        assert len(np.unique(batch)) == P * K
        cities = miner.city_of_place[miner.place_of_image[batch]]  # [P, K]
        assert (cities == cities[:, :1]).all()  # a slot comes from one city
        for i, slot in enumerate(batch):
            xy = miner.image_xy[slot]
            pairwise = np.linalg.norm(xy[:, None] - xy[None], axis=-1)
            assert (pairwise[~np.eye(K, dtype=bool)] < THRESHOLD).all()
            for j in range(i + 1, P):  # same city: the neighbours of a slot left the graph
                if cities[i, 0] == cities[j, 0]:
                    apart = np.linalg.norm(xy[:, None] - miner.image_xy[batch[j]][None], axis=-1)
                    assert (apart >= THRESHOLD).all()


def test_batches_are_a_pure_function_of_the_seed_and_the_descriptors() -> None:
    miner = _cities()
    first = miner.batches(3, seed=7, epoch=1)
    np.testing.assert_array_equal(first, _cities().batches(3, seed=7, epoch=1))
    assert not np.array_equal(first, miner.batches(3, seed=8, epoch=1))
    miner.set_descriptors(np.random.default_rng(9).normal(size=miner.descriptors.shape))
    assert not np.array_equal(first, miner.batches(3, seed=7, epoch=1))


def test_similar_places_are_drawn_with_probability_max_distance_minus_distance() -> None:
    descriptors = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0], [4.0, 0.0]])  # distances to place 0: 0, 1, 2, 4
    np.testing.assert_allclose(similar_place_probabilities(descriptors, 0), [0.0, 3 / 5, 2 / 5, 0.0])
    # from place 3: distances 4, 3, sqrt(20), 0 -> weights sqrt(20) - 4, sqrt(20) - 3, 0, 0
    w = np.array([math.sqrt(20) - 4, math.sqrt(20) - 3, 0.0, 0.0])
    np.testing.assert_allclose(similar_place_probabilities(descriptors, 3), w / w.sum())


def test_too_few_cliques_is_a_config_error_naming_the_setting() -> None:
    miner = _cities(cities=1, places=2)
    with pytest.raises(ConfigError, match="places_per_batch"):
        miner.batch(np.random.default_rng(0))
    with pytest.raises(ConfigError, match="one descriptor per place"):
        miner.set_descriptors(np.zeros((3, 8)))


def test_local_coordinates_give_haversine_distances_at_street_scale() -> None:
    lat_lon = np.array([[45.5017, -73.5673], [45.5019, -73.5670], [45.5015, -73.5676]])
    xy = local_metric_coordinates(lat_lon)
    lat, lon = np.radians(lat_lon[:, 0]), np.radians(lat_lon[:, 1])
    for i, j in ((0, 1), (0, 2), (1, 2)):
        a = math.sin((lat[j] - lat[i]) / 2) ** 2 + math.cos(lat[i]) * math.cos(lat[j]) * math.sin((lon[j] - lon[i]) / 2) ** 2
        haversine = 2 * 6_371_008.8 * math.asin(math.sqrt(a))
        assert abs(np.linalg.norm(xy[i] - xy[j]) - haversine) < 1e-3 * haversine


def test_a_city_out_of_cliques_hands_over_to_a_city_new_to_the_batch() -> None:
    miner = _cities(cities=8)
    miner.similar_places = 1  # anchor + 1 place: 10 images, at most 2 slots per city
    for batch in miner.batches(4, seed=1):
        cities = miner.city_of_place[miner.place_of_image[batch[:, 0]]]  # [P]
        runs = [c for i, c in enumerate(cities) if i == 0 or c != cities[i - 1]]
        assert len(runs) == len(set(runs)) >= P // 2  # consecutive per city, never back to a used one


def test_gsv_inputs_recover_the_synthetic_city_street_spacing(tiny_data) -> None:
    from aggzoo.data.gsv_cities import GSVCitiesDataset
    from aggzoo.data.synthetic import PLACE_SPACING_M, QUERY_JITTER_M
    from aggzoo.training.clique_mining import gsv_clique_inputs

    dataset = GSVCitiesDataset(tiny_data.gsv)
    place_of_image, city_of_place, xy, paths = gsv_clique_inputs(dataset)
    assert len(paths) == len(place_of_image) == dataset.num_images and len(city_of_place) == len(dataset)
    # the generator jitters each image of a place by up to QUERY_JITTER_M per axis around it, and puts
    # consecutive places of a street PLACE_SPACING_M apart (streets start 1 km apart)
    spread = 2 * math.sqrt(2) * QUERY_JITTER_M
    centres = np.stack([xy[place_of_image == p].mean(axis=0) for p in range(len(dataset))])
    for p in range(len(dataset)):
        own = xy[place_of_image == p]
        assert np.linalg.norm(own[:, None] - own[None], axis=-1).max() <= spread + 0.1
    same_city = city_of_place[:, None] == city_of_place[None]
    gaps = np.linalg.norm(centres[:, None] - centres[None], axis=-1)[same_city & ~np.eye(len(dataset), dtype=bool)]
    assert abs(gaps.min() - PLACE_SPACING_M) <= spread
    # places are further apart than 25 m + their spread: every clique is the images of one place
    descriptors = np.random.default_rng(0).normal(size=(len(dataset), 8))
    miner = CliqueMiner(place_of_image, city_of_place, xy, descriptors, places_per_batch=4)
    batch = miner.batch(np.random.default_rng(0))
    assert batch.shape == (4, 4) and len({paths[i] for i in batch.ravel()}) == 16
    assert all(len(set(place_of_image[slot])) == 1 for slot in batch)
