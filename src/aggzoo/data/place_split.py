"""A validation set carved off the training places, for training data without a validation benchmark
(``data.val_split``): model selection must not look at the test set.

The split is by place, so no place has images on both sides, and deterministic (no random draw: the
same places on every run and every resume). The validation places are the *last* ``places`` place
ids; the ``gap`` places just before them belong to neither side, so that validation places are not
the immediate neighbours of training places (in Nordland, consecutive place ids are consecutive
frames along the railway, ~200 m apart; in GSV-Cities, ids of a city are consecutive).

The validation set is a :class:`~aggzoo.data.retrieval_set.RetrievalSet`: per place, its newest
image is the database image and each of its other images a query whose one positive is that
database image (the place identity GSV-Cities' labels define, as the training loss uses it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from aggzoo.data.gsv_cities import GSVCitiesDataset
from aggzoo.data.retrieval_set import RetrievalSet
from aggzoo.errors import ConfigError

__all__ = ["PlaceSplit", "hold_out_places", "split_places", "val_split_from_config"]

#: the keys of ``data.val_split`` (the keyword arguments of :func:`hold_out_places`)
_OPTIONS = ("places", "gap", "name")


@dataclass(frozen=True)
class PlaceSplit:
    """Place ids on each side of the split (each sorted); ``gap`` holds the ids used by neither."""

    train: tuple[int, ...]
    gap: tuple[int, ...]
    val: tuple[int, ...]


def split_places(place_ids: Sequence[int], *, places: int, gap: int, setting: str = "data.val_split") -> PlaceSplit:
    """The last ``places`` of the sorted ``place_ids`` for validation, the ``gap`` before them for
    nothing, the rest for training. ``setting`` names the config node in errors."""
    ids = sorted(int(p) for p in place_ids)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (places, gap)) or places < 1 or gap < 0:
        raise ConfigError(f"{setting}.places={places} must be an integer of at least 1 and {setting}.gap={gap} one of "
                          f"at least 0 (counts of places), e.g. {setting}={{places: 200, gap: 10}}")
    if len(ids) - places - gap < 2:
        raise ConfigError(f"{setting}: {places} validation places + a gap of {gap} leave {len(ids) - places - gap} of the "
                          f"{len(ids)} training places (at least 2 are needed); lower {setting}.places or {setting}.gap")
    val_start = len(ids) - places
    train_end = val_start - gap
    return PlaceSplit(train=tuple(ids[:train_end]), gap=tuple(ids[train_end:val_start]), val=tuple(ids[val_start:]))


def hold_out_places(dataset: GSVCitiesDataset, *, places: int, gap: int = 0, name: str = "val_split") -> RetrievalSet:
    """Remove the validation places and the gap from ``dataset`` (in place: it keeps only the training
    places) and return the validation places as a retrieval set called ``name``.

    ``[N_val]`` database images (each place's newest) and ``[N_q]`` queries (its other images; all
    of them, not only ``img_per_place``), each with the one positive of its own place.
    """
    split = split_places(dataset.place_ids.tolist(), places=places, gap=gap)
    held = {pid: dataset.places[pid] for pid in split.val}
    database, queries, positives = [], [], []
    for index, pid in enumerate(split.val):
        newest, *others = held[pid]  # the dataset keeps each place's images newest first
        database.append(newest.path)
        for image in others:
            queries.append(image.path)
            positives.append(np.array([index], dtype=np.int64))
    dataset.keep_places(split.train)
    return RetrievalSet(name=name, database_paths=tuple(database), query_paths=tuple(queries),
                        positives=tuple(positives))


def val_split_from_config(dataset: GSVCitiesDataset, options: Mapping[str, Any],
                          setting: str = "data.val_split") -> RetrievalSet:
    """:func:`hold_out_places` with the options of the ``data.val_split`` node; an unknown key or a
    missing ``places`` is a :class:`~aggzoo.errors.ConfigError` that names it."""
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown or "places" not in options:
        what = f"{setting}.{unknown[0]} is not an option" if unknown else f"{setting}.places is missing"
        raise ConfigError(f"{what}; {setting} takes places (validation places, the last place ids), gap (places "
                          f"between training and validation, default 0) and name, e.g. {setting}={{places: 200, gap: 10}}")
    return hold_out_places(dataset, **dict(options))
