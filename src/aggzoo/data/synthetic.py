"""Deterministic synthetic "city" for visual place recognition: the project's embedded default dataset.

A procedural city of places (street-side facades: buildings with window grids, shop fronts and signs,
a far skyline, trees, lamp posts, sidewalk and road) is generated from a seed with numpy and PIL only,
and each place is photographed under several *conditions*: viewpoint (crop, scale, shift, roll,
shear), time of day (day / dusk / night, with lit windows, glowing signs and street lamps), season
(summer / autumn / winter / spring: foliage colour, snow, colour cast), weather (clear / overcast /
fog / rain streaks), sensor noise and random occluders (cars, pedestrians).

Places on the same street share a style (palette, window style, roof and texture type), so
neighbouring places are hard negatives; the layout of each place (building widths and heights,
window grids, signs, trees) is fixed across conditions, so its identity stays learnable.

The dataset is written in the same on-disk formats as real data, so it goes through the real loaders:

- training set, GSV-Cities layout (one CSV per city, one row per image)::

      <root>/gsv/Dataframes/<City>.csv      place_id,year,month,northdeg,city_id,lat,lon,panoid
      <root>/gsv/Images/<City>/<City>_<place_id:07d>_<year:04d>_<month:02d>_<northdeg:03d>_<lat>_<lon>_<panoid>.jpg

  ``place_id`` restarts at 0 in every city (the GSV-Cities loader makes ids unique by adding
  ``city_index * 10**5``); ``<lat>``/``<lon>`` in the name are ``str(float(csv_value))``.

- validation and test sets, VG layout (gmberton's VPR-datasets-downloader), on places disjoint
  from the training places and from each other::

      <root>/vg/images/{val,test}/{database,queries}/
          @UTM_east@UTM_north@zone@letter@lat@lon@pano@tile@heading@pitch@roll@height@timestamp@note@.jpg

  The database holds one image per place under the reference condition ``day-summer-clear``;
  queries are the other conditions (the note field names the condition). Places lie along straight
  streets, ``PLACE_SPACING_M`` = 50 m apart; a query is taken at most ``QUERY_JITTER_M`` from its
  place, so with the standard 25 m radius each query has exactly its own place's database image as
  positive and the neighbouring places (>= 40 m away) are negatives. The UTM coordinates are a
  local metric frame in a fictitious district (like the fake UTM of SPED/Nordland); lat/lon are
  derived from it with an equirectangular approximation, good to about a metre.

Every image is drawn from its own RNG seeded by ``(seed, split, place, image)``, so the output is
byte-identical for a given seed whatever the number of worker processes.

Difficulty (``SyntheticCityConfig.difficulty``, default 1.0) scales the strength of every condition
change. The default was calibrated on the default-size test split (150 places, 300 queries) with an
ImageNet EfficientNet-Lite0 at 160x120: global average pooling gives Recall@1 ~0.46 (seeds 0 and 1),
a 1x1-conv + flatten head trained on the frozen stride-16 features ~0.95, on the frozen stride-32
features ~0.75-0.8; raw 16x16 grey pixels ~0.17-0.19.

Command line: ``python -m aggzoo.data.synthetic --root DIR --seed 0`` generates and prints counts
and the time taken.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import hashlib
import json
import math
import os
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from filelock import FileLock
from PIL import Image, ImageDraw, ImageFilter

__all__ = [
    "COMPLETE_FILE",
    "CONFIG_FILE",
    "GENERATOR_VERSION",
    "PLACE_SPACING_M",
    "QUERY_JITTER_M",
    "REFERENCE_CONDITION",
    "SyntheticCityConfig",
    "data_cache_dir",
    "default_root",
    "ensure_synthetic_city",
    "synthetic_city_path",
    "generate",
]

# Bump whenever the pixels or the layout change: it is part of the cache key, so caches made by an
# older generator are rebuilt instead of silently reused.
GENERATOR_VERSION = 1

PLACE_SPACING_M = 50.0
QUERY_JITTER_M = 5.0
REFERENCE_CONDITION = "day-summer-clear"

CONFIG_FILE = "synthetic_config.json"
COMPLETE_FILE = ".synthetic_complete"

# Split codes feed the RNG keys; they must never change (they define the images).
_SPLIT_CODES = {"train": 1, "val": 2, "test": 3}
_STREET_BLOCK_M = 1000.0  # streets start on a 1 km grid so no two streets come within 25 m
_STREETS_PER_ROW = 8
_UTM_ZONE, _UTM_LETTER = "31", "U"
_VG_DISTRICTS = {"val": (600_000.0, 5_400_000.0), "test": (640_000.0, 5_400_000.0)}
_VG_LATLON_ORIGIN = {"val": (48.75, 4.35), "test": (48.75, 4.90)}
_METRES_PER_DEG_LAT = 111_320.0

_TIMES = ("day", "dusk", "night")
_SEASONS = ("summer", "autumn", "winter", "spring")
_WEATHERS = ("clear", "overcast", "fog", "rain")
# Queries lean towards the hard conditions; training images see everything, the reference included.
_QUERY_WEIGHTS = ((0.40, 0.30, 0.30), (0.25, 0.25, 0.30, 0.20), (0.35, 0.25, 0.22, 0.18))
_TRAIN_WEIGHTS = ((0.45, 0.20, 0.35), (0.35, 0.20, 0.25, 0.20), (0.40, 0.20, 0.20, 0.20))
_SEASON_MONTHS = {"summer": (6, 7, 8), "autumn": (9, 10, 11), "winter": (12, 1, 2), "spring": (3, 4, 5)}

# Material labels of the canonical scene; photometric conditions act per material.
SKY, FAR, FACADE, WINDOW, DOOR, SIGN, ROOF, VEG, POLE, SIDEWALK, ROAD, MARKING, LAMP, SHOP = range(14)


@dataclass(frozen=True)
class SyntheticCityConfig:
    """Size and seed of a synthetic city; the defaults are the embedded default dataset.

    Args:
        seed: master seed; the same seed gives byte-identical files.
        num_cities: number of GSV-Cities training cities (one CSV each), each with its own style.
        train_places: training places in total, split as evenly as possible over the cities.
        images_per_train_place: images per training place (GSV-Cities has >= 4).
        val_places: places of the VG ``val`` split (one database image each).
        test_places: places of the VG ``test`` split (one database image each).
        queries_per_place: query images per val/test place, each under a different condition.
        places_per_street: consecutive places sharing one street style (the hard negatives).
        image_size: ``(width, height)`` of every JPEG.
        jpeg_quality: JPEG quality of every image.
        difficulty: strength of the condition changes (photometric, viewpoint, occluders, weather,
            noise) of queries and training images: 0 keeps only what a condition *is* (sky colour,
            lit windows, foliage colour), 1 is the calibrated default, up to 1.5 is harder.
    """

    seed: int = 0
    num_cities: int = 1
    train_places: int = 300
    images_per_train_place: int = 4
    val_places: int = 100
    test_places: int = 150
    queries_per_place: int = 2
    places_per_street: int = 10
    image_size: tuple[int, int] = (160, 120)
    jpeg_quality: int = 90
    difficulty: float = 1.0

    def __post_init__(self) -> None:
        # JSON round trips give lists; keep the dataclass hashable and comparable.
        object.__setattr__(self, "image_size", tuple(int(v) for v in self.image_size))
        checks = {
            "num_cities": self.num_cities >= 1,
            "train_places": self.train_places >= self.num_cities,
            "images_per_train_place": self.images_per_train_place >= 1,
            "val_places": self.val_places >= 1,
            "test_places": self.test_places >= 1,
            "queries_per_place": 1 <= self.queries_per_place <= 8,
            "places_per_street": self.places_per_street >= 1,
            "image_size": len(self.image_size) == 2 and min(self.image_size) >= 32,
            "jpeg_quality": 1 <= self.jpeg_quality <= 100,
            "difficulty": 0.0 <= self.difficulty <= 1.5,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(
                f"SyntheticCityConfig: invalid {', '.join(bad)} in {self!r}; expected counts >= 1 "
                "(train_places >= num_cities, 1 <= queries_per_place <= 8), image sides >= 32 px "
                "and 1 <= jpeg_quality <= 100, 0 <= difficulty <= 1.5"
            )

    def to_dict(self) -> dict:
        """The config as plain JSON-able values (what ``synthetic_config.json`` stores)."""
        d = dataclasses.asdict(self)
        d["image_size"] = list(self.image_size)
        return d

    def digest(self) -> str:
        """Short hash of the config and ``GENERATOR_VERSION``: the cache key."""
        payload = json.dumps({"config": self.to_dict(), "version": GENERATOR_VERSION}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]


# -- Plan: places, coordinates, conditions and file names (cheap, done in the main process) --------


@dataclass(frozen=True)
class _Shot:
    """One image to render: its condition, viewpoint role and path relative to the root."""

    relpath: str
    time: str
    season: str
    weather: str
    reference: bool  # database view: near-canonical viewpoint, reference condition
    key: tuple[int, ...]  # RNG key of this image


@dataclass(frozen=True)
class _PlaceJob:
    """One place: the keys of its street style and layout, and the shots to render."""

    style_key: tuple[int, ...]
    layout_key: tuple[int, ...]
    shots: tuple[_Shot, ...]


def _rng(*key: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(k) & 0xFFFFFFFF for k in key]))


def _city_names(num_cities: int) -> list[str]:
    # Letters only: GSV-Cities file names are split on "_" and the name is also the CSV stem.
    stems = ("Synthville", "Pixelburg", "Rasterton", "Voxelhaven", "Texelford", "Gridmouth")
    return [stems[i % len(stems)] + ("" if i < len(stems) else chr(ord("A") + i // len(stems) - 1))
            for i in range(num_cities)]


def _split_counts(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def _place_position(index: int, places_per_street: int, street_rng_key: tuple[int, ...]) -> tuple[float, float, float]:
    """Metric (east, north) offset of a place in its district and the camera heading in degrees.

    Streets are straight, start on a 1 km grid and run in a random direction; the camera looks
    at the facades, perpendicular to the street.
    """
    street, slot = divmod(index, places_per_street)
    direction = float(_rng(*street_rng_key, street).uniform(0.0, 180.0))
    ox = (street % _STREETS_PER_ROW) * _STREET_BLOCK_M
    oy = (street // _STREETS_PER_ROW) * _STREET_BLOCK_M
    rad = math.radians(direction)
    # Heading is clockwise from north: a street at heading d runs along (sin d, cos d).
    east = ox + slot * PLACE_SPACING_M * math.sin(rad)
    north = oy + slot * PLACE_SPACING_M * math.cos(rad)
    return east, north, (direction + 90.0) % 360.0


def _latlon(east_off: float, north_off: float, origin: tuple[float, float]) -> tuple[float, float]:
    lat0, lon0 = origin
    lat = lat0 + north_off / _METRES_PER_DEG_LAT
    lon = lon0 + east_off / (_METRES_PER_DEG_LAT * math.cos(math.radians(lat0)))
    return round(float(lat), 6), round(float(lon), 6)


def _sample_conditions(rng: np.random.Generator, n: int, weights, exclude: str | None) -> list[tuple[str, str, str]]:
    """``n`` distinct (time, season, weather) triples, never ``exclude``."""
    seen: set[tuple[str, str, str]] = set()
    out: list[tuple[str, str, str]] = []
    available = len(_TIMES) * len(_SEASONS) * len(_WEATHERS) - (exclude is not None)
    while len(out) < n:
        cond = tuple(str(rng.choice(options, p=np.asarray(w) / sum(w)))
                     for options, w in zip((_TIMES, _SEASONS, _WEATHERS), weights))
        # Repeats only once every combination has been used (more images than combinations).
        if "-".join(cond) == exclude or (cond in seen and len(seen) < available):
            continue
        seen.add(cond)
        out.append(cond)
    return out


def _plan_train(config: SyntheticCityConfig) -> tuple[list[_PlaceJob], dict[str, list[list]]]:
    """Jobs for the GSV-Cities training cities and the CSV rows of each city."""
    jobs: list[_PlaceJob] = []
    rows: dict[str, list[list]] = {}
    code = _SPLIT_CODES["train"]
    for city_idx, (city, n_places) in enumerate(zip(_city_names(config.num_cities),
                                                    _split_counts(config.train_places, config.num_cities))):
        rows[city] = []
        # Each city is its own district (and style family), a degree of latitude from the next.
        origin = (45.0 + city_idx, 2.0 + 0.5 * city_idx)
        for place in range(n_places):
            east, north, heading = _place_position(place, config.places_per_street, (config.seed, code, city_idx, 7))
            prng = _rng(config.seed, code, city_idx, place, 1)
            conds = _sample_conditions(prng, config.images_per_train_place, _TRAIN_WEIGHTS, None)
            shots = []
            for k, (tod, season, weather) in enumerate(conds):
                jitter = prng.uniform(-QUERY_JITTER_M, QUERY_JITTER_M, size=2)
                lat, lon = _latlon(east + jitter[0], north + jitter[1], origin)
                year = int(prng.integers(2008, 2024))
                month = int(prng.choice(_SEASON_MONTHS[season]))
                northdeg = int(round(heading + prng.uniform(-10, 10))) % 360
                panoid = f"syn{config.seed}c{city_idx}p{place}i{k}"
                name = (f"{city}_{place:07d}_{year:04d}_{month:02d}_{northdeg:03d}_"
                        f"{lat!r}_{lon!r}_{panoid}.jpg")
                rows[city].append([place, year, month, northdeg, city, repr(lat), repr(lon), panoid])
                shots.append(_Shot(f"gsv/Images/{city}/{name}", tod, season, weather, False,
                                   (config.seed, code, city_idx, place, 100 + k)))
            street = place // config.places_per_street
            jobs.append(_PlaceJob((config.seed, code, city_idx, street, 2),
                                  (config.seed, code, city_idx, place, 3), tuple(shots)))
    return jobs, rows


def _vg_name(east: float, north: float, lat: float, lon: float, pano: str, heading: float,
             timestamp: str, note: str) -> str:
    fields = [f"{east:.2f}", f"{north:.2f}", _UTM_ZONE, _UTM_LETTER, f"{lat:.6f}", f"{lon:.6f}",
              pano, "", f"{heading:.0f}", "", "", "", timestamp, note]
    return "@" + "@".join(fields) + "@.jpg"


def _plan_vg(config: SyntheticCityConfig, split: str, n_places: int) -> list[_PlaceJob]:
    """Jobs for one VG split: one reference database image and the queries of every place."""
    code = _SPLIT_CODES[split]
    e0, n0 = _VG_DISTRICTS[split]
    jobs = []
    for place in range(n_places):
        east, north, heading = _place_position(place, config.places_per_street, (config.seed, code, 0, 7))
        prng = _rng(config.seed, code, 0, place, 1)
        pano = f"{split}{place:05d}"
        lat, lon = _latlon(east, north, _VG_LATLON_ORIGIN[split])
        db_name = _vg_name(e0 + east, n0 + north, lat, lon, pano, heading, "201807", REFERENCE_CONDITION)
        shots = [_Shot(f"vg/images/{split}/database/{db_name}", *REFERENCE_CONDITION.split("-"), True,
                       (config.seed, code, 0, place, 100))]
        conds = _sample_conditions(prng, config.queries_per_place, _QUERY_WEIGHTS, REFERENCE_CONDITION)
        for k, cond in enumerate(conds):
            # Uniform in a disc of radius QUERY_JITTER_M: positives stay well inside 25 m.
            r = QUERY_JITTER_M * math.sqrt(prng.uniform())
            a = prng.uniform(0, 2 * math.pi)
            qe, qn = east + r * math.cos(a), north + r * math.sin(a)
            qlat, qlon = _latlon(qe, qn, _VG_LATLON_ORIGIN[split])
            month = int(prng.choice(_SEASON_MONTHS[cond[1]]))
            stamp = f"{int(prng.integers(2012, 2024)):04d}{month:02d}"
            q_heading = (heading + prng.uniform(-10, 10)) % 360
            q_name = _vg_name(e0 + qe, n0 + qn, qlat, qlon, pano, q_heading, stamp, "-".join(cond))
            shots.append(_Shot(f"vg/images/{split}/queries/{q_name}", *cond, False,
                               (config.seed, code, 0, place, 101 + k)))
        street = place // config.places_per_street
        jobs.append(_PlaceJob((config.seed, code, 0, street, 2), (config.seed, code, 0, place, 3), tuple(shots)))
    return jobs


# -- Canonical scene of a place: colour image + material labels + window ids -----------------------


@dataclass(frozen=True)
class _StreetStyle:
    """What places of one street share, so that neighbours look alike."""

    palette: np.ndarray  # [k, 3] facade colours
    far_colour: np.ndarray  # [3]
    glass: np.ndarray  # [3]
    sign_palette: np.ndarray  # [m, 3]
    window_w: float  # window width, fraction of the floor pitch
    window_h: float
    floor_pitch: float  # fraction of the canvas height
    roof_kinds: tuple[str, ...]
    texture: str  # "plain" | "bands" | "brick"
    tree_rate: float
    max_buildings: int


def _street_style(key: tuple[int, ...]) -> _StreetStyle:
    rng = _rng(*key)
    base_hue = rng.uniform(0, 1)
    # A few related facade colours around one hue: same street, same family.
    palette = np.stack([_hsv_to_rgb((base_hue + rng.normal(0, 0.05)) % 1, rng.uniform(0.15, 0.6),
                                    rng.uniform(0.45, 0.9)) for _ in range(3)])
    signs = np.stack([_hsv_to_rgb(rng.uniform(0, 1), rng.uniform(0.6, 1), rng.uniform(0.6, 1)) for _ in range(4)])
    roofs = (("flat", "cornice"), ("gable", "flat"), ("cornice", "stepped"), ("flat", "stepped"))
    return _StreetStyle(
        palette=palette,
        far_colour=_hsv_to_rgb(rng.uniform(0.5, 0.7), rng.uniform(0.05, 0.25), rng.uniform(0.35, 0.6)),
        glass=_hsv_to_rgb(rng.uniform(0.5, 0.65), rng.uniform(0.1, 0.4), rng.uniform(0.15, 0.45)),
        sign_palette=signs,
        window_w=rng.uniform(0.25, 0.5),
        window_h=rng.uniform(0.45, 0.7),
        floor_pitch=rng.uniform(0.075, 0.11),
        roof_kinds=roofs[int(rng.integers(len(roofs)))],
        texture=("plain", "bands", "brick")[int(rng.integers(3))],
        tree_rate=rng.uniform(0.0, 1.2),
        max_buildings=int(rng.integers(3, 5)),
    )


def _hsv_to_rgb(h: float, s: float, v: float) -> np.ndarray:
    i = int(h * 6) % 6
    f = h * 6 - int(h * 6)
    p, q, t = v * (1 - s), v * (1 - s * f), v * (1 - s * (1 - f))
    rgb = [(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)][i]
    return np.array(rgb, dtype=np.float32) * 255.0


class _Canvas:
    """Draws the same primitives into a colour image, a material map and a window-id map."""

    def __init__(self, width: int, height: int) -> None:
        self.w, self.h = width, height
        self.rgb = Image.new("RGB", (width, height))
        self.mat = Image.new("L", (width, height), SKY)
        self.wid = Image.new("L", (width, height), 0)
        self._d = (ImageDraw.Draw(self.rgb), ImageDraw.Draw(self.mat), ImageDraw.Draw(self.wid))
        self._next_window = 1

    def shape(self, kind: str, xy, colour, material: int, window: bool = False) -> None:
        fill = tuple(int(c) for c in np.clip(colour, 0, 255))
        wid = 0
        if window:
            # Ids 1..255 cycle; sharing an id only ties two windows' lit/unlit state together.
            wid = self._next_window
            self._next_window = self._next_window % 255 + 1
        for draw, value in zip(self._d, (fill, material, wid)):
            getattr(draw, kind)(xy, fill=value)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return np.asarray(self.rgb, dtype=np.float32), np.asarray(self.mat), np.asarray(self.wid)


def _jitter(rng: np.random.Generator, colour: np.ndarray, amount: float) -> np.ndarray:
    return np.clip(colour + rng.normal(0, amount, 3), 0, 255)


def _draw_far_skyline(cv: _Canvas, rng: np.random.Generator, style: _StreetStyle, ground: int) -> None:
    x = -int(rng.integers(0, 10))
    while x < cv.w:
        bw = int(rng.integers(cv.w // 14, cv.w // 5))
        top = ground - int(rng.uniform(0.35, 0.75) * ground)
        cv.shape("rectangle", [x, top, x + bw, ground], _jitter(rng, style.far_colour, 8), FAR)
        if rng.uniform() < 0.15:  # antenna / spire: thin, tall, distinctive in silhouette
            cx = x + bw // 2
            cv.shape("rectangle", [cx - 1, top - int(0.12 * ground), cx + 1, top], style.far_colour * 0.9, FAR)
        x += bw


def _draw_building(cv: _Canvas, rng: np.random.Generator, style: _StreetStyle, x0: int, x1: int, ground: int) -> None:
    h = cv.h
    pitch = max(6, int(style.floor_pitch * h * rng.uniform(0.9, 1.15)))
    floors = int(rng.integers(3, max(4, int(0.72 * ground / pitch))))
    top = max(int(0.06 * h), ground - floors * pitch - int(0.3 * pitch))
    colour = _jitter(rng, style.palette[int(rng.integers(len(style.palette)))], 10)
    cv.shape("rectangle", [x0, top, x1, ground], colour, FACADE)
    _draw_texture(cv, rng, style, colour, x0, x1, top, ground, pitch)
    _draw_roof(cv, rng, style, colour, x0, x1, top, pitch)
    shop_h = int(1.3 * pitch)
    _draw_windows(cv, rng, style, x0, x1, top + int(0.5 * pitch), ground - shop_h, pitch)
    _draw_shopfront(cv, rng, style, colour, x0, x1, ground - shop_h, ground)


def _draw_texture(cv: _Canvas, rng, style: _StreetStyle, colour, x0, x1, top, ground, pitch) -> None:
    if style.texture == "bands":
        for y in range(top + pitch, ground, pitch):
            cv.shape("rectangle", [x0, y, x1, y + max(1, pitch // 6)], colour * 0.8, FACADE)
    elif style.texture == "brick":
        step = max(3, pitch // 3)
        for y in range(top + step, ground, step):
            cv.shape("line", [x0, y, x1, y], colour * 0.88, FACADE)


def _draw_roof(cv: _Canvas, rng, style: _StreetStyle, colour, x0, x1, top, pitch) -> None:
    kind = style.roof_kinds[int(rng.integers(len(style.roof_kinds)))]
    roof_col = _jitter(rng, colour * 0.55, 12)
    if kind == "cornice":
        cv.shape("rectangle", [x0 - 1, top - max(2, pitch // 4), x1 + 1, top + 1], roof_col, ROOF)
    elif kind == "gable":
        cv.shape("polygon", [(x0, top), (x1, top), ((x0 + x1) // 2, top - int(rng.uniform(0.8, 2.0) * pitch))],
                 roof_col, ROOF)
    elif kind == "stepped":
        inset = (x1 - x0) // 4
        cv.shape("rectangle", [x0 + inset, top - pitch, x1 - inset, top], colour * 0.9, FACADE)
        cv.shape("rectangle", [x0 + inset, top - pitch - 2, x1 - inset, top - pitch], roof_col, ROOF)
    else:
        cv.shape("rectangle", [x0, top - 2, x1, top], roof_col, ROOF)


def _draw_windows(cv: _Canvas, rng, style: _StreetStyle, x0, x1, y0, y1, pitch) -> None:
    col_pitch = max(5, int(pitch * rng.uniform(0.8, 1.3)))
    ww = max(2, int(style.window_w * col_pitch * 2 * rng.uniform(0.85, 1.15)))
    ww = min(ww, col_pitch - 2)
    wh = max(2, int(style.window_h * pitch))
    ncols = max(1, (x1 - x0 - 4) // col_pitch)
    margin = (x1 - x0 - ncols * col_pitch) // 2 + (col_pitch - ww) // 2
    # Some facades have a blank bay or a missing column: a per-place, condition-proof signature.
    skip_col = int(rng.integers(ncols)) if ncols > 2 and rng.uniform() < 0.35 else -1
    for y in range(y0, y1 - wh + 1, pitch):
        for c in range(ncols):
            if c == skip_col:
                continue
            x = x0 + margin + c * col_pitch
            cv.shape("rectangle", [x, y, x + ww - 1, y + wh - 1], _jitter(rng, style.glass, 10), WINDOW, window=True)


def _draw_shopfront(cv: _Canvas, rng, style: _StreetStyle, colour, x0, x1, y0, ground) -> None:
    width = x1 - x0
    door_w = max(3, width // 8)
    door_x = x0 + int(rng.uniform(0.05, 0.95) * (width - door_w))
    cv.shape("rectangle", [door_x, y0 + (ground - y0) // 4, door_x + door_w, ground],
             _jitter(rng, colour * 0.35, 10), DOOR)
    # Shop window on the wider side of the door.
    left = door_x - x0 > x1 - door_x - door_w
    sx0, sx1 = (x0 + 3, door_x - 3) if left else (door_x + door_w + 3, x1 - 3)
    if sx1 - sx0 > 6:
        cv.shape("rectangle", [sx0, y0 + (ground - y0) // 3, sx1, ground - 3],
                 _jitter(rng, style.glass * 1.2, 10), SHOP, window=True)
    if rng.uniform() < 0.75:
        sign_col = style.sign_palette[int(rng.integers(len(style.sign_palette)))]
        sw = int(width * rng.uniform(0.35, 0.85))
        sx = x0 + int(rng.uniform(0, 1) * (width - sw))
        sh = max(3, (ground - y0) // 4)
        cv.shape("rectangle", [sx, y0, sx + sw, y0 + sh], sign_col, SIGN)
        letter_col = 255 - sign_col if rng.uniform() < 0.5 else sign_col * 0.3
        lx = sx + 2
        while lx < sx + sw - 3:  # "lettering": short blocks of varying width
            lw = int(rng.integers(1, 4))
            cv.shape("rectangle", [lx, y0 + 1, lx + lw, y0 + sh - 1], letter_col, SIGN)
            lx += lw + int(rng.integers(2, 4))
    if rng.uniform() < 0.3:  # striped awning
        a, b = _jitter(rng, style.sign_palette[0], 20), np.array([235.0, 235.0, 230.0])
        ay = y0 + (ground - y0) // 4
        stripe = max(2, width // 12)
        for i, sx in enumerate(range(sx0, max(sx0 + 1, sx1), stripe)):
            cv.shape("polygon", [(sx, ay), (sx + stripe, ay), (sx + stripe + 2, ay + 5), (sx - 2, ay + 5)],
                     a if i % 2 == 0 else b, FACADE)


def _draw_street(cv: _Canvas, rng, style: _StreetStyle, ground: int) -> None:
    w, h = cv.w, cv.h
    kerb = ground + max(3, int(0.07 * h))
    cv.shape("rectangle", [0, ground, w, kerb], np.array([150.0, 148, 142]) + rng.normal(0, 8), SIDEWALK)
    cv.shape("rectangle", [0, kerb, w, h], np.array([70.0, 70, 74]) + rng.normal(0, 6), ROAD)
    cv.shape("rectangle", [0, kerb, w, kerb + 1], np.array([190.0, 190, 185]), SIDEWALK)
    dash, gap = int(rng.integers(10, 20)), int(rng.integers(8, 16))
    y = kerb + int(0.55 * (h - kerb))
    for x in range(-int(rng.integers(0, dash + gap)), w, dash + gap):
        cv.shape("rectangle", [x, y, x + dash, y + 1], np.array([225.0, 225, 215]), MARKING)


def _draw_trees_and_lamps(cv: _Canvas, rng, style: _StreetStyle, ground: int) -> None:
    w, h = cv.w, cv.h
    for _ in range(int(rng.poisson(style.tree_rate))):
        x = int(rng.uniform(0.05, 0.95) * w)
        trunk_top = ground - int(rng.uniform(0.12, 0.22) * h)
        cv.shape("rectangle", [x - 1, trunk_top, x + 1, ground + 3], np.array([80.0, 60, 40]), POLE)
        r = int(rng.uniform(0.07, 0.12) * h)
        green = _hsv_to_rgb(rng.uniform(0.22, 0.35), rng.uniform(0.5, 0.8), rng.uniform(0.3, 0.6))
        for _ in range(3):
            dx, dy = rng.normal(0, 0.5 * r, 2)
            cx, cy = x + dx, trunk_top + dy
            cv.shape("ellipse", [cx - r, cy - r, cx + r, cy + 0.8 * r], _jitter(rng, green, 10), VEG)
    for _ in range(int(rng.integers(0, 3))):
        x = int(rng.uniform(0.05, 0.95) * w)
        top = ground - int(rng.uniform(0.25, 0.35) * h)
        cv.shape("rectangle", [x, top, x + 1, ground + 4], np.array([45.0, 45, 50]), POLE)
        cv.shape("rectangle", [x - 3, top - 2, x + 4, top], np.array([200.0, 200, 190]), LAMP)


def _render_scene(style: _StreetStyle, layout_key: tuple[int, ...], width: int, height: int):
    """Canonical (wider than any view) scene of one place: rgb float [H, W, 3], material and window id maps."""
    rng = _rng(*layout_key)
    cv = _Canvas(width, height)
    ground = int(rng.uniform(0.74, 0.8) * height)
    _draw_far_skyline(cv, rng, style, ground)
    n = int(rng.integers(2, style.max_buildings + 1))
    cuts = np.concatenate([[0.0], np.cumsum(rng.dirichlet(np.full(n, 3.0)))]) * width
    for i in range(n):
        gap_l = int(rng.integers(0, 4)) if i > 0 and rng.uniform() < 0.4 else 0
        _draw_building(cv, rng, style, int(cuts[i]) + gap_l, int(cuts[i + 1]) - 1, ground)
    _draw_street(cv, rng, style, ground)
    _draw_trees_and_lamps(cv, rng, style, ground)
    return cv.arrays()


# -- Conditions: photometric changes per material, then viewpoint, occluders, weather, noise -------
# Every strength below is scaled by d = difficulty * _STRENGTH through _toward(): d = 0 leaves
# only the discrete content of a condition (sky colour, lit windows, foliage colour), d = 1 is the
# hardest setting the ranges below were written for. The random draws never depend on d, so d
# changes strengths, not content.

# Strength of the default (difficulty 1.0); see the module docstring for the calibration. At full
# strength (1.0) global average pooling fell to R@1 ~0.3, but trained heads on frozen features
# stayed near 0.6 too, so the default keeps the identity learnable.
_STRENGTH = 0.65


def _toward(value, neutral, d: float):
    """``value`` moved towards ``neutral`` as the difficulty ``d`` falls from 1 to 0."""
    return neutral + d * (np.asarray(value, np.float32) - neutral)


def _sky(time_of_day: str, weather: str, height: int, rng: np.random.Generator) -> np.ndarray:
    """Vertical sky gradient [H, 1, 3] for a condition."""
    tops = {"day": (70, 130, 215), "dusk": (60, 50, 120), "night": (8, 10, 28)}
    bottoms = {"day": (175, 205, 235), "dusk": (245, 140, 80), "night": (35, 35, 60)}
    top, bottom = np.array(tops[time_of_day], np.float32), np.array(bottoms[time_of_day], np.float32)
    if weather != "clear":
        grey = {"day": 185.0, "dusk": 110.0, "night": 25.0}[time_of_day]
        top, bottom = 0.25 * top + 0.75 * grey, 0.25 * bottom + 0.75 * grey
    t = np.linspace(0, 1, height, dtype=np.float32)[:, None, None]
    return (top * (1 - t) + bottom * t) * rng.uniform(0.9, 1.1)


def _apply_season(img: np.ndarray, mat: np.ndarray, season: str, rng: np.random.Generator, d: float) -> np.ndarray:
    if season == "summer":
        return img
    veg = mat == VEG
    lum = img.mean(axis=2, keepdims=True) / 110.0
    if season == "autumn":
        foliage = _hsv_to_rgb(rng.uniform(0.02, 0.12), rng.uniform(0.6, 0.9), rng.uniform(0.55, 0.85))
        img = np.where(veg[..., None], foliage * lum, img) * _toward([1.08, 1.0, 0.85], 1.0, d)
    elif season == "winter":
        img = np.where(veg[..., None], np.array([105.0, 95, 90], np.float32) * lum, img)
        # Snow on the ground and roofs, patchy so it does not erase the kerb entirely.
        snow_mask = np.isin(mat, (SIDEWALK, ROAD, MARKING, ROOF))
        patch = d * rng.uniform(0.55, 0.95) * (0.75 + 0.25 * rng.random(mat.shape, dtype=np.float32))
        snow = np.array([232.0, 236, 242], np.float32)
        img = np.where(snow_mask[..., None], img * (1 - patch[..., None]) + snow * patch[..., None], img)
        grey = img.mean(axis=2, keepdims=True)
        desat = 0.45 * d
        img = ((1 - desat) * img + desat * grey) * _toward([0.92, 0.98, 1.1], 1.0, d)
    elif season == "spring":
        blossom = _hsv_to_rgb(rng.uniform(0.85, 0.98), rng.uniform(0.2, 0.45), 0.95)
        img = np.where(veg[..., None], blossom * np.clip(lum, 0.6, 1.2), img)
        img = img * _toward([1.0, 1.04, 1.0], 1.0, d)
    return img


def _apply_time(img: np.ndarray, mat: np.ndarray, wid: np.ndarray, time_of_day: str, rng: np.random.Generator,
                d: float) -> np.ndarray:
    exposure = rng.uniform(0.85, 1.15)
    if time_of_day == "day":
        return img * _toward(exposure, 1.0, d)
    if time_of_day == "dusk":
        img = img * _toward(rng.uniform(0.45, 0.65) * np.array([1.15, 0.85, 0.7]), 1.0, d)
        lit_p, sign_gain = 0.3, 1.1
    else:
        img = img * _toward(rng.uniform(0.25, 0.4) * np.array([0.7, 0.8, 1.25]), 1.0, d)
        lit_p, sign_gain = rng.uniform(0.4, 0.75), 1.3
    # Lit windows: a random subset of windows per image, the window *grid* itself does not move.
    lit_table = rng.random(256) < lit_p
    lit_table[0] = False
    warmth = rng.uniform(0.6, 1.0, 256).astype(np.float32)
    lit = lit_table[wid]
    window_light = np.array([255.0, 215, 140], np.float32) * warmth[wid][..., None]
    img = np.where(lit[..., None], window_light, img)
    glow = mat == SIGN
    img = np.where(glow[..., None], img / max(img.mean(), 1.0) * 60.0 * sign_gain + 40.0 * sign_gain, img)
    lamps = mat == LAMP
    if not lamps.any():
        return img
    halo = np.asarray(Image.fromarray(lamps.astype(np.uint8) * 255).filter(ImageFilter.GaussianBlur(6)),
                      np.float32)[..., None] / 255.0
    return img + halo * np.array([255.0, 200, 120], np.float32) * 3.0 + lamps[..., None] * 255.0


def _apply_weather(img: np.ndarray, mat: np.ndarray, time_of_day: str, weather: str, rng: np.random.Generator,
                   d: float) -> np.ndarray:
    if weather == "clear":
        return img
    grey = img.mean(axis=2, keepdims=True)
    flat = 0.4 * d  # flat light: colours wash out
    img = (1 - flat) * img + flat * grey
    if weather == "rain":
        img = img * _toward(0.8, 1.0, d)
    if weather == "fog":
        depth = np.full(mat.shape, 0.55, np.float32)
        depth[mat == FAR] = 0.9
        depth[mat == SKY] = 1.0
        rows = np.linspace(1.0, 0.7, mat.shape[0], dtype=np.float32)[:, None]
        alpha = (d * rng.uniform(0.4, 0.7) * depth * rows)[..., None]
        fog = {"day": 200.0, "dusk": 120.0, "night": 30.0}[time_of_day]
        img = img * (1 - alpha) + fog * alpha
    return img


def _view_transform(ref: bool, out_w: int, out_h: int, canvas_w: int, canvas_h: int, rng: np.random.Generator,
                    d: float):
    """PIL AFFINE coefficients mapping output pixels into the canonical scene (crop, scale, shift, roll, shear)."""
    if ref:
        frac, dx, roll, shear = rng.uniform(0.70, 0.75), rng.uniform(-0.02, 0.02), 0.0, 0.0
    else:
        frac = 0.72 + d * rng.uniform(-0.08, 0.08)
        dx = d * rng.uniform(-0.08, 0.08)
        roll, shear = d * math.radians(rng.uniform(-2.5, 2.5)), d * rng.uniform(-0.06, 0.06)
    s = frac * canvas_w / out_w
    a, b = s * math.cos(roll), s * (shear - math.sin(roll))
    dd, e = s * math.sin(roll), s * math.cos(roll)
    corners = [(u, v) for u in (-out_w / 2, out_w / 2) for v in (-out_h / 2, out_h / 2)]
    xs = [a * u + b * v for u, v in corners]
    ys = [dd * u + e * v for u, v in corners]
    # Centre: horizontally around the middle, vertically anywhere the view stays on the canvas.
    cx = canvas_w / 2 + dx * canvas_w
    cx = min(max(cx, -min(xs)), canvas_w - 1 - max(xs))
    lo, hi = -min(ys), canvas_h - 1 - max(ys)
    mid = 0.5 * (lo + hi) + 0.3 * (hi - lo)  # the reference view keeps a little more street than sky
    cy = rng.uniform(lo, hi) if hi > lo else canvas_h / 2
    cy = mid if ref or hi <= lo else min(max(mid + d * (cy - mid), lo), hi)
    c = cx - a * out_w / 2 - b * out_h / 2
    f = cy - dd * out_w / 2 - e * out_h / 2
    return (a, b, c, dd, e, f)


def _draw_occluders(img: Image.Image, time_of_day: str, rng: np.random.Generator, ref: bool, d: float) -> None:
    w, h = img.size
    draw = ImageDraw.Draw(img)
    gain = {"day": 1.0, "dusk": 0.6, "night": 0.2}[time_of_day]
    n = int(rng.integers(0, 2)) if ref else int(rng.integers(0, 3))
    n = min(n, round(2 * d))
    for _ in range(n):
        col = tuple(int(c * gain) for c in rng.integers(20, 235, 3))
        if rng.uniform() < 0.5:  # car
            cw = int(rng.uniform(0.25, 0.45) * w)
            ch = int(cw * rng.uniform(0.3, 0.4))
            x, yb = int(rng.uniform(-0.1, 0.9) * w), int(rng.uniform(0.88, 1.02) * h)
            draw.rounded_rectangle([x, yb - ch, x + cw, yb - ch // 4], radius=max(1, ch // 5), fill=col)
            draw.rectangle([x + cw // 5, yb - ch - ch // 3, x + 4 * cw // 5, yb - ch], fill=col)
            r = max(2, ch // 5)
            for wx in (x + cw // 5, x + 4 * cw // 5):
                draw.ellipse([wx - r, yb - ch // 4 - r, wx + r, yb - ch // 4 + r], fill=(15, 15, 15))
            if time_of_day != "day":
                draw.ellipse([x + cw - 4, yb - ch + 2, x + cw, yb - ch + 5], fill=(255, 240, 200))
        else:  # pedestrian
            ph = int(rng.uniform(0.22, 0.4) * h)
            x, yb = int(rng.uniform(0, 1) * w), int(rng.uniform(0.72, 0.95) * h)
            pw, head = max(3, ph // 4), max(2, ph // 8)
            draw.rounded_rectangle([x - pw // 2, yb - ph + 2 * head, x + pw // 2, yb], radius=max(1, pw // 3), fill=col)
            skin = tuple(int(c * gain) for c in (200, 160, 130))
            draw.ellipse([x - head, yb - ph, x + head, yb - ph + 2 * head], fill=skin)


def _rain_streaks(arr: np.ndarray, rng: np.random.Generator, d: float) -> np.ndarray:
    h, w = arr.shape[:2]
    layer = Image.new("L", (w, h), 0)
    draw = ImageDraw.Draw(layer)
    slant = rng.uniform(-0.4, 0.4)
    for _ in range(int(rng.integers(80, 180))):
        x, y = rng.uniform(0, w), rng.uniform(0, h)
        length = rng.uniform(5, 14)
        draw.line([x, y, x + slant * length, y + length], fill=int(rng.integers(90, 200)))
    return arr + np.asarray(layer, np.float32)[..., None] * (0.25 * d)


def _render_shot(scene, shot: _Shot, size: tuple[int, int], difficulty: float) -> Image.Image:
    """One photograph of a place under ``shot``'s condition, ``size`` = (W, H)."""
    rng = _rng(*shot.key)
    ref, d = shot.reference, difficulty * _STRENGTH
    canvas = _lit_scene(scene, shot, rng, d)
    coeffs = _view_transform(ref, size[0], size[1], canvas.width, canvas.height, rng, d)
    view = canvas.transform(size, Image.Transform.AFFINE, coeffs, resample=Image.Resampling.BILINEAR)
    return _camera_effects(view, shot, rng, d)


def _lit_scene(scene, shot: _Shot, rng: np.random.Generator, d: float) -> Image.Image:
    """The canonical scene under ``shot``'s condition (sky, season, time, weather) and camera response
    (white balance, exposure, gamma), before any viewpoint: an RGB image of the scene's size. The
    first half of a photograph; ``rng`` continues into :func:`_camera_effects`."""
    rgb, mat, wid = scene
    ref = shot.reference
    img = np.where((mat == SKY)[..., None], _sky(shot.time, shot.weather, mat.shape[0], rng), rgb)
    img = _apply_season(img, mat, shot.season, rng, d)
    img = _apply_time(img, mat, wid, shot.time, rng, d)
    img = _apply_weather(img, mat, shot.time, shot.weather, rng, d)
    # Camera response: white balance, exposure and gamma differ between any two photographs.
    wb = rng.uniform(0.95, 1.05, 3) if ref else _toward(rng.uniform(0.85, 1.15, 3), 1.0, d)
    img = np.clip(img * wb.astype(np.float32), 0, 255).astype(np.uint8)
    gamma = 1.0 if ref else float(_toward(rng.uniform(0.8, 1.25), 1.0, d))
    # Gamma through a 256-entry table: the same curve as a float power, a fraction of the cost.
    lut = np.round(255.0 * (np.arange(256) / 255.0) ** gamma).astype(np.uint8)
    return Image.fromarray(lut[img])


def _camera_effects(view: Image.Image, shot: _Shot, rng: np.random.Generator, d: float) -> Image.Image:
    """The second half of a photograph, on the image after the viewpoint: occluders (cars, pedestrians),
    blur, rain streaks and sensor noise."""
    ref = shot.reference
    _draw_occluders(view, shot.time, rng, ref, d)
    blur = rng.uniform(0.4, 1.0)
    if not ref and rng.uniform() < 0.3 * d:
        view = view.filter(ImageFilter.GaussianBlur(blur))
    out = np.asarray(view, np.float32)
    if shot.weather == "rain":
        out = _rain_streaks(out, rng, d)
    sigma = {"day": 2.5, "dusk": 4.0, "night": 6.0}[shot.time] * rng.uniform(0.7, 1.3)
    out = out + rng.standard_normal(out.shape, dtype=np.float32) * max(1.0, sigma * d)
    return Image.fromarray(np.clip(out + 0.5, 0, 255).astype(np.uint8))


# -- Writing ---------------------------------------------------------------------------------------


def _render_place(job: _PlaceJob, root: str, size: tuple[int, int], quality: int, difficulty: float) -> int:
    """Render and write every shot of one place; returns the number of images written."""
    style = _street_style(job.style_key)
    # The canonical scene is wider and taller than any view, so crops and shifts stay on it.
    scene = _render_scene(style, job.layout_key, round(1.5 * size[0]), round(1.35 * size[1]))
    for shot in job.shots:
        path = Path(root) / shot.relpath
        _render_shot(scene, shot, size, difficulty).save(path, format="JPEG", quality=quality)
    return len(job.shots)


def _write_csvs(root: Path, rows: dict[str, list[list]]) -> None:
    for city, city_rows in rows.items():
        with open(root / "gsv" / "Dataframes" / f"{city}.csv", "w", newline="") as fh:
            writer = csv.writer(fh, lineterminator="\n")
            writer.writerow(["place_id", "year", "month", "northdeg", "city_id", "lat", "lon", "panoid"])
            writer.writerows(city_rows)


def _prepare_root(root: Path) -> None:
    """Empty the dataset folders of ``root``, refusing to delete anything this module did not write."""
    ours = (root / CONFIG_FILE).exists()
    for sub in ("gsv", "vg"):
        if (root / sub).exists():
            if not ours:
                raise FileExistsError(
                    f"{root / sub} exists but {root} holds no {CONFIG_FILE}, so it was not written by "
                    "aggzoo.data.synthetic; pass an empty or new folder as root"
                )
            shutil.rmtree(root / sub)
    (root / COMPLETE_FILE).unlink(missing_ok=True)


def generate(root: str | os.PathLike, config: SyntheticCityConfig = SyntheticCityConfig(), *,
             workers: int | None = None) -> Path:
    """Generate the synthetic city into ``root`` (replacing an earlier synthetic city there) and return ``root``.

    Produces ``root/gsv`` (GSV-Cities layout: ``config.num_cities`` CSVs and
    ``config.train_places * config.images_per_train_place`` images), ``root/vg/images/{val,test}``
    (VG layout: one database image and ``config.queries_per_place`` queries per place),
    ``root/synthetic_config.json`` (the config, its digest and the generator version) and, last, the
    completion marker ``root/.synthetic_complete``.

    ``workers`` (default ``min(2, cpu_count)``) only changes the speed, never the bytes written.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    with _lock(root):
        return _generate_locked(root, config, workers)


def _lock(root: Path) -> FileLock:
    """An inter-process lock beside ``root`` (not inside it: ``_prepare_root`` empties the folder), so
    two processes never write (or delete) the same city at once."""
    root.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(root.parent / f".{root.name}.lock"))


def _expected_counts(config: SyntheticCityConfig) -> dict[str, int]:
    """How many files of each part a complete city of ``config`` holds (checked against the folder
    before its completion marker is trusted)."""
    train_jobs, rows = _plan_train(config)
    counts = {"train": sum(len(job.shots) for job in train_jobs), "csv": len(rows)}
    for split, n_places in (("val", config.val_places), ("test", config.test_places)):
        shots = [s for job in _plan_vg(config, split, n_places) for s in job.shots]
        for part in ("database", "queries"):
            counts[f"{split}/{part}"] = sum(1 for s in shots if Path(s.relpath).parent.name == part)
    return counts


def _generate_locked(root: Path, config: SyntheticCityConfig, workers: int | None) -> Path:
    _prepare_root(root)
    meta = {"config": config.to_dict(), "digest": config.digest(), "generator_version": GENERATOR_VERSION}
    (root / CONFIG_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")

    train_jobs, rows = _plan_train(config)
    jobs = (train_jobs + _plan_vg(config, "val", config.val_places) + _plan_vg(config, "test", config.test_places))
    for folder in {str(Path(s.relpath).parent) for job in jobs for s in job.shots} | {"gsv/Dataframes"}:
        (root / folder).mkdir(parents=True, exist_ok=True)
    _write_csvs(root, rows)

    workers = min(2, os.cpu_count() or 1) if workers is None else max(1, workers)
    args = (str(root), config.image_size, config.jpeg_quality, config.difficulty)
    if workers == 1:
        for job in jobs:
            _render_place(job, *args)
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            list(pool.map(_render_place, jobs, *[[a] * len(jobs) for a in args], chunksize=8))
    # Written last: its presence means every file above is complete. It records the file counts, which
    # are checked against the folder before the marker is trusted.
    counts = _count(root)
    expected = _expected_counts(config)
    if counts != expected:
        raise RuntimeError(f"synthetic city at {root} is incomplete after generation: {counts} != {expected}")
    (root / COMPLETE_FILE).write_text(json.dumps({"digest": config.digest(), "counts": counts}, sort_keys=True) + "\n")
    return root


def default_root(config: SyntheticCityConfig = SyntheticCityConfig()) -> Path:
    """Cache folder of ``config``: ``$AGGZOO_DATA/synthetic_city/<digest>``, or
    ``~/.cache/aggzoo/synthetic_city/<digest>`` when ``AGGZOO_DATA`` is unset."""
    return data_cache_dir() / "synthetic_city" / config.digest()


def data_cache_dir() -> Path:
    """Where generated datasets are cached: ``$AGGZOO_DATA``, or ``~/.cache/aggzoo`` when it is unset."""
    base = os.environ.get("AGGZOO_DATA")
    return Path(base) if base else Path.home() / ".cache" / "aggzoo"


def _is_complete(root: Path, config: SyntheticCityConfig) -> bool:
    """The marker names ``config`` and the folder holds every file it lists (a marker over a folder
    that lost files, e.g. one emptied by a concurrent run of an older aggzoo, is not trusted)."""
    try:
        marker = json.loads((root / COMPLETE_FILE).read_text())
        meta = json.loads((root / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(marker, dict) or marker.get("digest") != config.digest() or meta.get("digest") != config.digest():
        return False
    expected = _expected_counts(config)
    return marker.get("counts") == expected and _count(root) == expected


def ensure_synthetic_city(root: str | os.PathLike | None = None,
                          config: SyntheticCityConfig = SyntheticCityConfig(), *,
                          workers: int | None = None) -> Path:
    """Return a folder holding the complete synthetic city of ``config``, generating it only if needed.

    ``root`` defaults to :func:`default_root`. A folder that holds a complete city generated from the
    same config (and generator version) is returned untouched; an interrupted generation (no
    completion marker), a folder missing files its marker counts, or a different config is regenerated
    in place. Generation holds a file lock beside ``root``, so concurrent first uses (two terminals, a
    CI matrix, a parallel sweep) wait for one generation instead of deleting each other's files.
    """
    root = Path(root) if root is not None else default_root(config)
    if _is_complete(root, config):
        return root
    # Another process may be generating the same city: wait for it, then look again.
    with _lock(root):
        if _is_complete(root, config):
            return root
        root.mkdir(parents=True, exist_ok=True)
        return _generate_locked(root, config, workers)


def synthetic_city_path(part: str, config: SyntheticCityConfig = SyntheticCityConfig()) -> Path:
    """``<city>/<part>`` of the (cached) synthetic city of ``config``: ``"gsv"`` (training, GSV-Cities
    layout) or ``"vg"`` (val/test, VG layout). What the Hydra data and benchmark configs point at."""
    if part not in ("gsv", "vg"):
        raise ValueError(f"part must be 'gsv' or 'vg', got {part!r}")
    return ensure_synthetic_city(None, config) / part


def _count(root: Path) -> dict[str, int]:
    counts = {"train": sum(1 for _ in (root / "gsv" / "Images").rglob("*.jpg")),
              "csv": sum(1 for _ in (root / "gsv" / "Dataframes").glob("*.csv"))}
    for split in ("val", "test"):
        for part in ("database", "queries"):
            counts[f"{split}/{part}"] = sum(1 for _ in (root / "vg" / "images" / split / part).glob("*.jpg"))
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Generate the aggzoo synthetic city dataset.")
    parser.add_argument("--root", type=Path, default=None, help="output folder (default: the cache folder)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-cities", type=int, default=SyntheticCityConfig.num_cities)
    parser.add_argument("--difficulty", type=float, default=SyntheticCityConfig.difficulty)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--force", action="store_true", help="regenerate even if a complete copy exists")
    args = parser.parse_args(argv)
    config = SyntheticCityConfig(seed=args.seed, num_cities=args.num_cities, difficulty=args.difficulty)
    root = args.root if args.root is not None else default_root(config)
    start = time.perf_counter()
    if args.force:
        generate(root, config, workers=args.workers)
    else:
        ensure_synthetic_city(root, config, workers=args.workers)
    elapsed = time.perf_counter() - start
    counts = _count(root)
    csvs = counts.pop("csv")
    print(f"synthetic city at {root} ({csvs} city CSVs)")
    for name, n in counts.items():
        print(f"  {name:16s} {n:6d} images")
    print(f"  total            {sum(counts.values()):6d} images in {elapsed:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
