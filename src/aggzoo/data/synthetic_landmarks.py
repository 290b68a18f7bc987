"""Deterministic synthetic landmark-retrieval set in the revisited Oxford / Paris layout.

A small offline stand-in for ROxford5k / RParis6k (Radenovic et al., "Revisiting Oxford and Paris:
Large-Scale Image Retrieval Benchmarking", CVPR 2018; layout of filipradenovic/revisitop,
``python/dataset.py``), drawn with the synthetic city's renderer (:mod:`aggzoo.data.synthetic`: its
buildings, streets, conditions and camera effects), so that mAP can be seen without a download.

Scenes. Every scene is a street with one *subject* building in the middle:

- a **landmark**: a building of its own style (palette, windows, roof, texture) with a crown (clock
  tower, dome or spires), among neighbours of another street's style;
- a **look-alike**: a building of a landmark's own style with a crown of its own (same family, other
  layout): the hard negatives;
- a **street scene**: an ordinary building among neighbours of the same street style.

Photographs of a landmark, by the revisitop definitions:

- ``easy``: near-frontal (yaw within 15 degrees), close, day light, the whole building in view;
- ``hard``: one of oblique (yaw 35-50 degrees), far (the building ~24-32 % of the width),
  a large occluder (a bus, a tree), night or dusk, fog / rain / snow (a quarter: one of the viewpoint
  and one of the light or weather changes); at least 70 % of the building in view;
- ``junk``: the building only partly in view (3-25 % of its facade: cut by the frame edge, or a close-up
  of a detail); ignored for its queries, as revisitop's junk;
- queries: a near-frontal day view with the whole landmark and its surroundings, and a box ``bbx``
  around the landmark; retrieval uses the crop.

Look-alikes and street scenes are photographed twice each (one easy-like, one hard-like view): the
distractors of every query.

Files (``root`` = the dataset folder; revisitop's ``<data>/<dataset>/`` with ``dataset`` =
:data:`DATASET`)::

    <root>/jpg/<name>.jpg                  database and query images (queries are not in the database)
    <root>/gnd_synthetic_landmarks.pkl     {"imlist": [names], "qimlist": [names],
                                            "gnd": [{"bbx": [x1, y1, x2, y2], "easy": [...],
                                                     "hard": [...], "junk": [...]}, ...]}
    <root>/landmark_ids.csv                landmark_id,images  (GLDv2 train_clean.csv columns: every
                                            database image under the id of the building it shows,
                                            names space-separated in imlist order)
    <root>/synthetic_config.json           the config, its digest and the generator version
    <root>/.synthetic_landmarks_complete   written last: the file counts

Names carry no label: ``synthetic_landmarks_<6 digits>`` from a seeded permutation; ``imlist`` is sorted
by name. ``bbx`` is zero-based in pixels with ``x2``, ``y2`` one past the last landmark pixel (PIL's
``crop`` box, as revisitop's Python crops). The pickle holds only dicts, lists, strings, ints and
floats, so a restricted unpickler reads it. ``easy`` / ``hard`` / ``junk`` are the indices of that
landmark's photographs; other landmarks, look-alikes and street scenes are negatives.

Class ids (``landmark_ids.csv``): landmarks ``0 .. landmarks-1``, then the look-alikes, then the street
scenes; every id has at least two images, so the set doubles as a tiny class-labelled training set
(a training set disjoint from a test set: the same generator with another ``seed``).

Difficulty, measured on the default set (seed 0; 10 landmarks, 30 queries, 250 database images) with
untrained baselines, queries cropped to ``bbx`` (mAP in %, Easy / Medium / Hard, revisitop's AP):
ImageNet EfficientNet-Lite0 (stride-16 features, 160x120) with global average pooling 64.8 / 40.4 / 5.3
(whole, uncropped queries: 40.4 / 30.4 / 10.2); 16x12 raw pixels 33.5 / 26.7 / 8.8. Easy positives
rank above 97 % of the negatives, hard ones above 55 % of them on average: learnable, not solved.

Every photograph is drawn from its own RNG seeded by ``(seed, kind, scene, image)``: the bytes are
identical for a seed whatever the number of worker processes. Generation writes into a hidden sibling
folder and renames it into place at the end (under a file lock beside the root), so a killed generation
never leaves a folder that looks complete.

Command line: ``python -m aggzoo.data.synthetic_landmarks [--root DIR] [--seed 0]`` generates (or
reuses) the set and prints its counts and the time taken.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import pickle
import re
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from aggzoo.data.class_labelled import ClassLabelledImages
from aggzoo.data.gldv2 import landmark_rows

# The city's renderer pieces (their one home is aggzoo.data.synthetic): drawing primitives, street
# styles, conditions and camera effects. Only the viewpoint (a perspective camera aimed at a subject
# building) and the crowns of the landmarks are new here.
from aggzoo.data.synthetic import (
    _STRENGTH,
    FACADE,
    ROOF,
    SKY,
    _camera_effects,
    _Canvas,
    _draw_building,
    _draw_far_skyline,
    _draw_street,
    _draw_trees_and_lamps,
    _jitter,
    _lit_scene,
    _lock,
    _rng,
    _Shot,
    _street_style,
    data_cache_dir,
)
from aggzoo.errors import ConfigError, DatasetLayoutError

__all__ = [
    "COMPLETE_FILE",
    "CONFIG_FILE",
    "DATASET",
    "GENERATOR_VERSION",
    "LANDMARK_IDS_FILE",
    "SyntheticLandmarksConfig",
    "default_landmarks_root",
    "ensure_synthetic_landmarks",
    "generate_synthetic_landmarks",
    "read_synthetic_landmark_ids",
    "synthetic_landmarks_root",
]

# Bump whenever the pixels or the layout change: it is part of the cache key.
GENERATOR_VERSION = 1

DATASET = "synthetic_landmarks"
CONFIG_FILE = "synthetic_config.json"
COMPLETE_FILE = ".synthetic_landmarks_complete"
LANDMARK_IDS_FILE = "landmark_ids.csv"
_NAME = re.compile(r"[0-9A-Za-z_]+")  # an image name in landmark_ids.csv (synthetic_landmarks_<6 digits>)
GND_FILE = f"gnd_{DATASET}.pkl"

# Scene codes feed the RNG keys; they must never change (they define the images).
_LANDMARK, _LOOKALIKE, _STREET, _NAMES = 11, 12, 13, 14
_DISTRACTOR_VIEWS = ("easy", "hard")  # each look-alike / street scene: one view of each kind
_CANVAS = (3.6, 1.6)  # scene canvas (width, height) in output widths / heights: room for far views
_CAMERA_DISTANCE = 2.5  # camera distance in subject widths: how strongly an oblique view converges
_QUERY_MIN_VISIBLE, _EASY_MIN_VISIBLE, _HARD_MIN_VISIBLE, _JUNK_MAX_VISIBLE = 1.0, 0.9, 0.7, 0.25


@dataclass(frozen=True)
class SyntheticLandmarksConfig:
    """Size and seed of a synthetic landmark set; the defaults are the embedded benchmark.

    Args:
        seed: master seed; the same seed gives byte-identical files (another seed: other landmarks).
        landmarks: landmark buildings, each with its own queries and photographs.
        queries_per_landmark: queries of each landmark (revisitop: 5 per landmark).
        easy_per_landmark, hard_per_landmark, junk_per_landmark: database photographs of each landmark
            in each class (junk: only partly in view).
        lookalikes_per_landmark: distractor buildings in each landmark's style, two photographs each.
        street_scenes: distractor street scenes (no landmark), two photographs each.
        image_size: ``(width, height)`` of every JPEG (queries included).
        jpeg_quality: JPEG quality of every image.
        difficulty: strength of the photometric changes, as the city's ``difficulty`` (0 .. 1.5).
    """

    seed: int = 0
    landmarks: int = 10
    queries_per_landmark: int = 3
    easy_per_landmark: int = 6
    hard_per_landmark: int = 6
    junk_per_landmark: int = 3
    lookalikes_per_landmark: int = 2
    street_scenes: int = 30
    image_size: tuple[int, int] = (224, 168)
    jpeg_quality: int = 90
    difficulty: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "image_size", tuple(int(v) for v in self.image_size))
        checks = {
            "landmarks": self.landmarks >= 1,
            "queries_per_landmark": self.queries_per_landmark >= 1,
            "easy_per_landmark": self.easy_per_landmark >= 1,
            "hard_per_landmark": self.hard_per_landmark >= 1,
            "junk_per_landmark": self.junk_per_landmark >= 0,
            "lookalikes_per_landmark": self.lookalikes_per_landmark >= 0,
            "street_scenes": self.street_scenes >= 0,
            "image_size": len(self.image_size) == 2 and min(self.image_size) >= 48,
            "jpeg_quality": 1 <= self.jpeg_quality <= 100,
            "difficulty": 0.0 <= self.difficulty <= 1.5,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ConfigError(
                f"SyntheticLandmarksConfig: invalid {', '.join(bad)} in {self!r}; expected landmarks, queries, "
                "easy and hard photographs >= 1, junk / look-alikes / street scenes >= 0, image sides >= 48 px, "
                "1 <= jpeg_quality <= 100 and 0 <= difficulty <= 1.5"
            )

    def to_dict(self) -> dict:
        """The config as plain JSON-able values (what ``synthetic_config.json`` stores)."""
        d = dataclasses.asdict(self)
        d["image_size"] = list(self.image_size)
        return d

    def digest(self) -> str:
        """Short hash of the config and ``GENERATOR_VERSION``: the cache key."""
        payload = json.dumps({"config": self.to_dict(), "version": GENERATOR_VERSION, "dataset": DATASET},
                             sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]


# -- Plan: scenes, photographs, names (cheap, in the main process) ----------------------------------


@dataclass(frozen=True)
class _Photo:
    """One image to render: its role and the RNG key that decides its condition and viewpoint."""

    name: str
    kind: str  # "query" | "easy" | "hard" | "junk"
    key: tuple[int, ...]


@dataclass(frozen=True)
class _SceneJob:
    """One scene: the keys of its subject building and of its surroundings, and the photographs to take."""

    class_id: int
    subject_style_key: tuple[int, ...]
    subject_layout_key: tuple[int, ...]
    surround_style_key: tuple[int, ...]
    surround_layout_key: tuple[int, ...]
    crown: bool
    photos: tuple[_Photo, ...]


def _plan(config: SyntheticLandmarksConfig) -> list[_SceneJob]:
    """Every scene and photograph of the set, in a fixed order (landmarks, look-alikes, street scenes)."""
    s = config.seed
    # (class id, code, scene keys, crown, kinds of its photographs)
    scenes: list[tuple[int, tuple[int, ...], tuple[int, ...], bool, list[str]]] = []
    per_landmark = (["query"] * config.queries_per_landmark + ["easy"] * config.easy_per_landmark
                    + ["hard"] * config.hard_per_landmark + ["junk"] * config.junk_per_landmark)
    for lm in range(config.landmarks):
        scenes.append((lm, (s, _LANDMARK, lm, 0), (s, _LANDMARK, lm), True, per_landmark))
    for lm in range(config.landmarks):
        for j in range(config.lookalikes_per_landmark):
            # The landmark's own style key: same palette family, windows and roofs; another layout.
            scenes.append((len(scenes), (s, _LANDMARK, lm, 0), (s, _LOOKALIKE, lm, j), True, list(_DISTRACTOR_VIEWS)))
    for k in range(config.street_scenes):
        scenes.append((len(scenes), (s, _STREET, k, 0), (s, _STREET, k), False, list(_DISTRACTOR_VIEWS)))

    total = sum(len(kinds) for *_, kinds in scenes)
    ids = _rng(s, _NAMES).permutation(total)
    jobs, n = [], 0
    for class_id, style_key, base, crown, kinds in scenes:
        photos = []
        for i, kind in enumerate(kinds):
            photos.append(_Photo(f"{DATASET}_{int(ids[n]):06d}", kind, (*base, 100 + i)))
            n += 1
        # Street scenes: subject and surroundings share one street style (an ordinary building).
        surround_style = style_key if not crown else (*base, 2)
        jobs.append(_SceneJob(class_id, style_key, (*base, 1), surround_style, (*base, 3), crown, tuple(photos)))
    return jobs


# -- Scene: a street with a subject building in the middle ------------------------------------------


def _canvas_size(size: tuple[int, int]) -> tuple[int, int]:
    return round(_CANVAS[0] * size[0]), round(_CANVAS[1] * size[1])


def _draw_crown(cv: _Canvas, rng: np.random.Generator, style, x0: int, x1: int, top: int) -> None:
    """What makes a building a landmark: a clock tower, a dome or twin spires on its roof line."""
    width = x1 - x0
    room = max(4, top - 3)  # never above the canvas
    kind = ("tower", "dome", "spires")[int(rng.integers(3))]
    colour = _jitter(rng, style.palette[int(rng.integers(len(style.palette)))] * 0.95, 12)
    roof_colour = _jitter(rng, colour * 0.5, 12)
    if kind == "tower":
        tw = max(6, int(width * rng.uniform(0.18, 0.3)))
        cx = x0 + int(rng.uniform(0.3, 0.7) * width)
        th = min(room, int(width * rng.uniform(0.35, 0.6)))
        cv.shape("rectangle", [cx - tw // 2, top - th, cx + tw // 2, top], colour, FACADE)
        r = max(2, int(0.3 * tw))
        cy = top - th + r + 2
        cv.shape("ellipse", [cx - r, cy - r, cx + r, cy + r], np.array([235.0, 230, 210]), FACADE)
        cv.shape("line", [cx, cy, cx, cy - r + 1], np.array([30.0, 30, 30]), FACADE)
        spire = min(top - th - 1, int(tw * rng.uniform(0.6, 1.2)))
        if spire > 1:
            cv.shape("polygon", [(cx - tw // 2 - 1, top - th), (cx + tw // 2 + 1, top - th), (cx, top - th - spire)],
                     roof_colour, ROOF)
    elif kind == "dome":
        rx = max(4, int(width * rng.uniform(0.2, 0.32)))
        ry = min(room - 2, int(rx * rng.uniform(0.7, 1.1)))
        cx = x0 + width // 2 + int(rng.uniform(-0.1, 0.1) * width)
        drum = max(2, ry // 4)
        cv.shape("rectangle", [cx - rx, top - drum, cx + rx, top], colour, FACADE)
        t = np.linspace(0.0, math.pi, 24)
        cv.shape("polygon", [(cx + rx * math.cos(a), top - drum - ry * math.sin(a)) for a in t], roof_colour, ROOF)
        lantern = max(2, rx // 5)
        cv.shape("rectangle", [cx - lantern // 2, top - drum - ry - lantern, cx + lantern // 2, top - drum - ry + 1],
                 colour, FACADE)
    else:
        sw = max(3, int(width * rng.uniform(0.08, 0.14)))
        sh = min(room, int(width * rng.uniform(0.5, 0.9)))
        for sx in (x0 + int(0.08 * width), x1 - int(0.08 * width) - sw):
            cv.shape("rectangle", [sx, top - sh // 2, sx + sw, top], colour, FACADE)
            cv.shape("polygon", [(sx - 1, top - sh // 2), (sx + sw + 1, top - sh // 2), (sx + sw // 2, top - sh)],
                     roof_colour, ROOF)


def _draw_subject(cv: _Canvas, job: _SceneJob, x0: int, x1: int, ground: int, top: int | None = None) -> int:
    """Draw the subject building (and its crown); returns the facade's top row, read off ``cv`` when
    ``top`` is not given, so ``cv`` must then hold the subject alone."""
    rng = _rng(*job.subject_layout_key)
    style = _street_style(job.subject_style_key)
    _draw_building(cv, rng, style, x0, x1, ground)
    if top is None:
        # The facade's top, read off its edge column (roofs and cornices sit above it).
        rows = np.flatnonzero(np.asarray(cv.mat)[:, min(x0 + 2, x1)] != SKY)
        top = int(rows[0]) if rows.size else ground // 2
    if job.crown:
        _draw_crown(cv, rng, style, x0, x1, top)
    return top


def _render_scene(job: _SceneJob, width: int, height: int, with_subject: bool = True):
    """Canonical scene of ``job``: (rgb [H, W, 3], material map, window ids) and the subject's mask [H, W].

    ``with_subject=False`` leaves the subject building out (its mask is still returned): the same
    scene with the landmark removed, which tests use to find the landmark's pixels.
    """
    rng = _rng(*job.surround_layout_key)
    surround = _street_style(job.surround_style_key)
    cv = _Canvas(width, height)
    ground = int(rng.uniform(0.76, 0.8) * height)
    _draw_far_skyline(cv, rng, surround, ground)
    subject_w = int(rng.uniform(0.16, 0.2) * width)
    x0 = (width - subject_w) // 2 + int(rng.uniform(-0.02, 0.02) * width)
    x1 = x0 + subject_w
    for lo, hi in ((0, x0 - 3), (x1 + 3, width)):  # neighbours on both sides
        n = int(rng.integers(2, surround.max_buildings + 1))
        cuts = lo + np.concatenate([[0.0], np.cumsum(rng.dirichlet(np.full(n, 3.0)))]) * (hi - lo)
        for i in range(n):
            _draw_building(cv, rng, surround, int(cuts[i]), int(cuts[i + 1]) - 1, ground)
    # Drawn last among the buildings, so leaving it out changes no other building's window ids.
    alone = _Canvas(width, height)
    top = _draw_subject(alone, job, x0, x1, ground)
    if with_subject:
        _draw_subject(cv, job, x0, x1, ground, top)
    _draw_street(cv, rng, surround, ground)
    _draw_trees_and_lamps(cv, rng, surround, ground)
    rgb, mat, wid = cv.arrays()
    return (rgb, mat, wid), np.asarray(alone.mat) != SKY


# -- Viewpoint: a perspective camera aimed at the subject --------------------------------------------


@dataclass(frozen=True)
class _View:
    """Camera of one photograph, relative to the subject.

    ``width_frac``: subject width in the image (fraction of W) at zero yaw; ``centre``: where the
    subject's centre lands (fractions of W and H); ``yaw_deg``: rotation of the facade plane about the
    vertical (oblique views); ``roll_deg``: rotation of the image.
    """

    width_frac: float
    centre: tuple[float, float]
    yaw_deg: float = 0.0
    roll_deg: float = 0.0


def _homography(view: _View, box: tuple[int, int, int, int], size: tuple[int, int]) -> np.ndarray:
    """3x3 map of canvas pixels to image pixels for ``view`` of the subject inside ``box`` (x0, y0, x1, y1).

    The facade is a plane at distance ``D`` (``_CAMERA_DISTANCE`` subject widths), turned by the yaw:
    a canvas point at ``(X, Y)`` from the subject's centre projects to
    ``u = f D X cos(t) / (D + X sin(t))``, ``v = f D Y / (D + X sin(t))`` (``f``: image pixels per
    canvas pixel at the centre), then the image is rolled and shifted to ``centre``.
    """
    x0, y0, x1, y1 = box
    bw = max(1, x1 - x0)
    cx, cy = 0.5 * (x0 + x1), 0.5 * (y0 + y1)
    f = view.width_frac * size[0] / bw
    dist = _CAMERA_DISTANCE * bw
    t, r = math.radians(view.yaw_deg), math.radians(view.roll_deg)
    project = np.array([[f * dist * math.cos(t), 0, 0], [0, f * dist, 0], [math.sin(t), 0, dist]])
    to_centre = np.array([[1, 0, -cx], [0, 1, -cy], [0, 0, 1.0]])
    roll = np.array([[math.cos(r), -math.sin(r), 0], [math.sin(r), math.cos(r), 0], [0, 0, 1.0]])
    shift = np.array([[1, 0, view.centre[0] * size[0]], [0, 1, view.centre[1] * size[1]], [0, 0, 1.0]])
    return shift @ roll @ project @ to_centre


def _apply(h: np.ndarray, xy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Points [N, 2] through homography ``h``: (points [N, 2], their homogeneous depth [N])."""
    p = np.concatenate([xy, np.ones((len(xy), 1))], axis=1) @ h.T
    return p[:, :2] / p[:, 2:3], p[:, 2]


def _visible_fraction(h: np.ndarray, mask_xy: np.ndarray, size: tuple[int, int]) -> float:
    """Fraction of the subject's facade (canvas pixels) that lands inside the image."""
    uv, depth = _apply(h, mask_xy + 0.5)
    inside = (depth > 0) & (uv[:, 0] >= 0) & (uv[:, 0] < size[0]) & (uv[:, 1] >= 0) & (uv[:, 1] < size[1])
    return float(inside.mean())


def _fits_canvas(h: np.ndarray, size: tuple[int, int], canvas_w: int) -> bool:
    """The image sees only the canvas horizontally (above and below, sky and road are extended) and
    nothing behind the camera."""
    corners = np.array([[0, 0], [size[0], 0], [0, size[1]], [size[0], size[1]]], float)
    xy, depth = _apply(np.linalg.inv(h), corners)
    return bool((depth > 0).all() and xy[:, 0].min() >= 0 and xy[:, 0].max() <= canvas_w - 1)


def _sample_view(kind: str, hard: set[str], rng: np.random.Generator, subject: tuple[np.ndarray, tuple],
                 size: tuple[int, int], canvas_w: int) -> tuple[_View, np.ndarray]:
    """A viewpoint of class ``kind`` that fits the canvas and shows the subject as the class requires."""
    mask_xy, box = subject
    for _ in range(200):
        if kind == "query":
            view = _View(rng.uniform(0.38, 0.52), (rng.uniform(0.4, 0.6), rng.uniform(0.48, 0.56)),
                         rng.uniform(-10, 10))
            lo, hi = _QUERY_MIN_VISIBLE, 1.0
        elif kind == "easy":
            view = _View(rng.uniform(0.5, 0.75), (rng.uniform(0.42, 0.58), rng.uniform(0.46, 0.56)),
                         rng.uniform(-15, 15), rng.uniform(-2, 2))
            lo, hi = _EASY_MIN_VISIBLE, 1.0
        elif kind == "hard":
            frac = rng.uniform(0.24, 0.32) if "far" in hard else rng.uniform(0.4, 0.65)
            yaw = rng.choice([-1, 1]) * rng.uniform(35, 50) if "oblique" in hard else rng.uniform(-15, 15)
            view = _View(frac, (rng.uniform(0.4, 0.6), rng.uniform(0.45, 0.6)), yaw, rng.uniform(-4, 4))
            lo, hi = _HARD_MIN_VISIBLE, 1.0
        else:  # junk: cut by the frame edge, or a close-up of a detail
            if rng.uniform() < 0.5:
                frac = rng.uniform(0.5, 0.9)
                shown = rng.uniform(0.1, 0.22)  # part of the width in view
                side = rng.choice([-1, 1])
                cx = 0.5 + side * (0.5 + frac * (0.5 - shown))
                view = _View(frac, (cx, rng.uniform(0.45, 0.55)), rng.uniform(-15, 15), rng.uniform(-3, 3))
            else:
                frac = rng.uniform(2.5, 4.0)
                view = _View(frac, (0.5 + rng.uniform(-0.3, 0.3) * frac, 0.5 + rng.uniform(-0.3, 0.3) * frac),
                             rng.uniform(-15, 15), rng.uniform(-3, 3))
            lo, hi = 0.03, _JUNK_MAX_VISIBLE
        h = _homography(view, box, size)
        if _fits_canvas(h, size, canvas_w) and lo <= _visible_fraction(h, mask_xy, size) <= hi:
            return view, h
    raise RuntimeError(f"no {kind} view fits the scene canvas after 200 tries (image size {size})")


# -- Photographs -------------------------------------------------------------------------------------


def _condition(kind: str, hard: set[str], rng: np.random.Generator) -> tuple[str, str, str]:
    """(time, season, weather) of a photograph: queries and easy views in day light, hard ones may be dark
    or in bad weather."""
    season = str(rng.choice(("summer", "spring", "autumn")))
    if kind == "query":
        return "day", str(rng.choice(("summer", "spring"))), "clear"
    if kind == "easy":
        return "day", season, str(rng.choice(("clear", "overcast")))
    time_of_day = str(rng.choice(("night", "dusk"))) if "dark" in hard else "day"
    weather = str(rng.choice(("clear", "overcast")))
    if "weather" in hard:
        weather = str(rng.choice(("fog", "rain", "snow")))
        if weather == "snow":
            season, weather = "winter", "overcast"
    return time_of_day, season, weather


_VIEW_FACTORS, _LIGHT_FACTORS = ("oblique", "far", "occluded"), ("dark", "weather")


def _hard_factors(kind: str, rng: np.random.Generator) -> set[str]:
    """What makes a hard view hard: one of a change of viewpoint (oblique, far, occluded), of light (dark)
    or of weather; a quarter of them add one of the other group (two at once are the hardest: with
    both in every hard view an untrained baseline ranked the hard positives below most negatives)."""
    if kind != "hard":
        return set()
    first = str(rng.choice(_VIEW_FACTORS + _LIGHT_FACTORS))
    other = _LIGHT_FACTORS if first in _VIEW_FACTORS else _VIEW_FACTORS
    return {first, str(rng.choice(other))} if rng.uniform() < 0.25 else {first}


def _draw_large_occluder(img: Image.Image, bbx: list[float], time_of_day: str, rng: np.random.Generator) -> None:
    """A bus or a tree in front of 30-50 % of the subject's box."""
    x1, y1, x2, y2 = bbx
    gain = {"day": 1.0, "dusk": 0.6, "night": 0.25}[time_of_day]
    draw = ImageDraw.Draw(img)
    w, h = x2 - x1, y2 - y1
    if rng.uniform() < 0.5:  # bus: the lower part of the facade, most of its width
        bw, bh = w * rng.uniform(0.7, 1.0), h * rng.uniform(0.35, 0.5)
        bx = x1 + rng.uniform(-0.2, 0.3) * w
        body = tuple(int(c * gain) for c in rng.integers(40, 230, 3))
        draw.rounded_rectangle([bx, y2 - bh, bx + bw, y2], radius=max(1, int(bh / 8)), fill=body)
        glass = tuple(int(c * gain) for c in (60, 80, 100))
        for k in range(5):
            wx = bx + (k + 0.15) * bw / 5
            draw.rectangle([wx, y2 - 0.9 * bh, wx + 0.7 * bw / 5, y2 - 0.55 * bh], fill=glass)
    else:  # tree: a canopy of overlapping discs
        r = min(w, h) * rng.uniform(0.25, 0.35)
        cx, cy = x1 + rng.uniform(0.25, 0.75) * w, y1 + rng.uniform(0.4, 0.7) * h
        green = np.array([60.0, 110, 50]) * gain
        draw.rectangle([cx - r / 8, cy, cx + r / 8, y2 + 0.2 * h], fill=tuple(int(c * 0.6) for c in green))
        for _ in range(4):
            dx, dy = rng.normal(0, 0.45 * r, 2)
            col = tuple(int(c) for c in np.clip(green + rng.normal(0, 12, 3), 0, 255))
            draw.ellipse([cx + dx - r, cy + dy - r, cx + dx + r, cy + dy + 0.8 * r], fill=col)


def _warp(canvas: Image.Image, h: np.ndarray, size: tuple[int, int], resample, sky) -> Image.Image:
    """``canvas`` seen through ``h`` (canvas -> image). Where the view looks above the canvas it sees
    ``sky`` (a colour, or 0 for a mask: a tall roof or crown that reaches the canvas edge is not
    stretched upwards); below it, the road's bottom row repeated."""
    inv = np.linalg.inv(h)
    corners = np.array([[0, 0], [size[0], 0], [0, size[1]], [size[0], size[1]]], float)
    ys = _apply(inv, corners)[0][:, 1]
    top = max(0, math.ceil(-ys.min()) + 2)
    bottom = max(0, math.ceil(ys.max() - canvas.height) + 2)
    if top or bottom:
        arr = np.asarray(canvas)
        above = np.broadcast_to(np.asarray(sky, arr.dtype), (top, *arr.shape[1:]))
        below = np.repeat(arr[-1:], bottom, axis=0)
        canvas = Image.fromarray(np.concatenate([above, arr, below], axis=0))
        inv = np.array([[1, 0, 0], [0, 1, top], [0, 0, 1.0]]) @ inv
    inv = inv / inv[2, 2]
    return canvas.transform(size, Image.Transform.PERSPECTIVE, tuple(inv.flatten()[:8]), resample=resample)


def _subject_geometry(mask: np.ndarray) -> tuple[np.ndarray, tuple[int, int, int, int]]:
    """The subject's canvas pixels as (x, y) rows [N, 2] and their box (x0, y0, x1, y1), x1 / y1 exclusive."""
    ys, xs = np.nonzero(mask)
    return np.stack([xs, ys], axis=1).astype(np.float64), (int(xs.min()), int(ys.min()), int(xs.max()) + 1,
                                                           int(ys.max()) + 1)


def _photograph(scene, mask: np.ndarray, photo: _Photo, size: tuple[int, int],
                difficulty: float) -> tuple[Image.Image, list[float]]:
    """One photograph of a scene and the box of its subject in it ([x1, y1, x2, y2], zero-based, x2/y2
    exclusive; empty box [0, 0, 0, 0] when the subject is not in view)."""
    rng = _rng(*photo.key)
    d = difficulty * _STRENGTH
    hard = _hard_factors(photo.kind, rng)
    time_of_day, season, weather = _condition(photo.kind, hard, rng)
    view, h = _sample_view(photo.kind, hard, rng, _subject_geometry(mask), size, scene[0].shape[1])
    # Queries and easy views keep the mild camera of the city's reference photographs.
    shot = _Shot("", time_of_day, season, weather, photo.kind in ("query", "easy"), photo.key)
    canvas = _lit_scene(scene, shot, rng, d)
    # The sky colour above the canvas, from its top row's sky (the subject's columns left out, so the
    # same scene without the subject gets the same colour).
    top_row, top_sky = np.asarray(canvas)[0], (scene[1][0] == SKY) & ~mask[0]
    sky = (top_row[top_sky] if top_sky.any() else top_row).mean(axis=0).round().astype(np.uint8)
    image = _warp(canvas, h, size, Image.Resampling.BILINEAR, sky)
    # The mask through the image's own (bilinear) sampling: the box holds every pixel the subject touches.
    seen = np.asarray(_warp(Image.fromarray(mask.astype(np.uint8) * 255), h, size, Image.Resampling.BILINEAR, 0)) > 0
    if seen.any():
        ys, xs = np.nonzero(seen)
        bbx = [float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1)]
    else:
        bbx = [0.0, 0.0, 0.0, 0.0]
    if "occluded" in hard:
        _draw_large_occluder(image, bbx, time_of_day, rng)
    return _camera_effects(image, shot, rng, d), bbx


def _render_job(job: _SceneJob, root: str, size: tuple[int, int], quality: int,
                difficulty: float) -> dict[str, list[float]]:
    """Render and write every photograph of one scene; returns the subject's box in each of them."""
    scene, mask = _render_scene(job, *_canvas_size(size))
    boxes = {}
    for photo in job.photos:
        image, boxes[photo.name] = _photograph(scene, mask, photo, size, difficulty)
        image.save(Path(root) / "jpg" / f"{photo.name}.jpg", format="JPEG", quality=quality)
    return boxes


# -- Ground truth and files --------------------------------------------------------------------------


def _ground_truth(jobs: list[_SceneJob], boxes: dict[str, list[float]]) -> tuple[dict, dict[int, list[str]]]:
    """The revisitop ``gnd`` dict and the database names of every class id."""
    database = sorted(p.name for job in jobs for p in job.photos if p.kind != "query")
    index = {name: i for i, name in enumerate(database)}
    qimlist, gnd = [], []
    classes: dict[int, list[str]] = {}
    for job in jobs:
        classes[job.class_id] = sorted((p.name for p in job.photos if p.kind != "query"), key=index.__getitem__)
        of_kind = {k: sorted(index[p.name] for p in job.photos if p.kind == k) for k in ("easy", "hard", "junk")}
        for photo in job.photos:
            if photo.kind == "query":
                qimlist.append(photo.name)
                gnd.append({"bbx": boxes[photo.name], **of_kind})
    return {"imlist": database, "qimlist": qimlist, "gnd": gnd}, classes


def _expected_counts(config: SyntheticLandmarksConfig) -> dict[str, int]:
    photos = [p for job in _plan(config) for p in job.photos]
    return {"jpg": len(photos), "queries": sum(p.kind == "query" for p in photos)}


def _count_jpgs(root: Path) -> int:
    return sum(1 for _ in (root / "jpg").glob("*.jpg"))


def _write_set(folder: Path, config: SyntheticLandmarksConfig, workers: int | None) -> None:
    """Every file of the set into the empty ``folder``, the completion marker last."""
    (folder / "jpg").mkdir(parents=True)
    meta = {"config": config.to_dict(), "digest": config.digest(), "generator_version": GENERATOR_VERSION,
            "dataset": DATASET}
    (folder / CONFIG_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    jobs = _plan(config)
    args = (str(folder), config.image_size, config.jpeg_quality, config.difficulty)
    workers = min(2, os.cpu_count() or 1) if workers is None else max(1, workers)
    if workers == 1:
        results = [_render_job(job, *args) for job in jobs]
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(_render_job, jobs, *[[a] * len(jobs) for a in args], chunksize=4))
    boxes = {name: box for result in results for name, box in result.items()}
    gnd, classes = _ground_truth(jobs, boxes)
    with open(folder / GND_FILE, "wb") as fh:
        pickle.dump(gnd, fh, protocol=4)
    lines = ["landmark_id,images"] + [f"{cid},{' '.join(names)}" for cid, names in sorted(classes.items())]
    (folder / LANDMARK_IDS_FILE).write_text("\n".join(lines) + "\n")
    counts = {"jpg": _count_jpgs(folder), "queries": len(gnd["qimlist"])}
    if counts != _expected_counts(config):
        raise RuntimeError(f"synthetic landmarks at {folder} incomplete: {counts} != {_expected_counts(config)}")
    (folder / COMPLETE_FILE).write_text(json.dumps({"digest": config.digest(), "counts": counts}, sort_keys=True) + "\n")


def _is_complete(root: Path, config: SyntheticLandmarksConfig) -> bool:
    """The marker names ``config`` and the folder holds the files it counts."""
    try:
        marker = json.loads((root / COMPLETE_FILE).read_text())
    except (OSError, ValueError):
        return False
    expected = _expected_counts(config)
    return (isinstance(marker, dict) and marker.get("digest") == config.digest() and marker.get("counts") == expected
            and (root / GND_FILE).is_file() and (root / LANDMARK_IDS_FILE).is_file()
            and _count_jpgs(root) == expected["jpg"])


def _generate_locked(root: Path, config: SyntheticLandmarksConfig, workers: int | None) -> Path:
    if root.exists() and any(root.iterdir()) and not (root / CONFIG_FILE).exists():
        raise FileExistsError(f"{root} is not empty and holds no {CONFIG_FILE}, so it was not written by "
                              "aggzoo.data.synthetic_landmarks; pass an empty or new folder as root")
    # Left-overs of killed generations (only ever written under this lock).
    for stale in root.parent.glob(f".{root.name}.partial-*"):
        shutil.rmtree(stale, ignore_errors=True)
    partial = root.parent / f".{root.name}.partial-{os.getpid()}"
    _write_set(partial, config, workers)
    if root.exists():
        old = root.parent / f".{root.name}.partial-old-{os.getpid()}"
        root.rename(old)
        shutil.rmtree(old)
    partial.rename(root)  # atomic: the folder appears complete or not at all
    return root


def generate_synthetic_landmarks(root: str | os.PathLike,
                                 config: SyntheticLandmarksConfig = SyntheticLandmarksConfig(), *,
                                 workers: int | None = None) -> Path:
    """Generate the set into ``root`` (replacing an earlier synthetic landmark set there) and return ``root``.

    ``workers`` (default ``min(2, cpu_count)``) only changes the speed, never the bytes written.
    """
    root = Path(root)
    with _lock(root):
        return _generate_locked(root, config, workers)


def default_landmarks_root(config: SyntheticLandmarksConfig = SyntheticLandmarksConfig()) -> Path:
    """Cache folder of ``config``: ``<data cache>/synthetic_landmarks/<digest>`` (``$AGGZOO_DATA`` or
    ``~/.cache/aggzoo``)."""
    return data_cache_dir() / DATASET / config.digest()


def ensure_synthetic_landmarks(root: str | os.PathLike | None = None,
                               config: SyntheticLandmarksConfig = SyntheticLandmarksConfig(), *,
                               workers: int | None = None) -> Path:
    """A folder holding the complete set of ``config``, generated only if it is not there yet.

    ``root`` defaults to :func:`default_landmarks_root`. A complete set of the same config (and generator
    version) is returned untouched; otherwise it is generated under a file lock beside ``root``, so
    concurrent first uses wait for one generation.
    """
    root = Path(root) if root is not None else default_landmarks_root(config)
    if _is_complete(root, config):
        return root
    with _lock(root):
        if _is_complete(root, config):
            return root
        return _generate_locked(root, config, workers)


def synthetic_landmarks_root(config: SyntheticLandmarksConfig = SyntheticLandmarksConfig()) -> Path:
    """The (cached) dataset folder of ``config``: ``jpg/`` and ``gnd_synthetic_landmarks.pkl``. What
    ``conf/benchmark/synthetic_landmarks.yaml`` points the revisitop reader at."""
    return ensure_synthetic_landmarks(None, config)


def read_synthetic_landmark_ids(root: str | os.PathLike) -> ClassLabelledImages:
    """The class-labelled database images of a synthetic landmark set: ``<root>/landmark_ids.csv``
    (``landmark_id,images``, the names space-separated), each name at ``<root>/jpg/<name>.jpg``.

    Queries are not in it. A set generated with another ``seed`` than the benchmark's is a training
    set disjoint from it (other buildings, other photographs).

    Raises:
        DatasetLayoutError: the CSV or a listed image is missing.
        DatasetFormatError: a row that is not ``<int>,<names>``.
    """
    root = Path(root)
    csv_path = root / LANDMARK_IDS_FILE
    layout = (f"expected a synthetic landmark set: {root}/{LANDMARK_IDS_FILE} (landmark_id,images) and "
              f"{root}/jpg/<name>.jpg; generate one with python -m aggzoo.data.synthetic_landmarks --root {root}")
    if not csv_path.is_file():
        raise DatasetLayoutError(f"{csv_path} not found; {layout}")
    paths: list[Path] = []
    labels: list[int] = []
    for label, names in landmark_rows(csv_path, layout, _NAME, "letters, digits and underscores"):
        paths += [root / "jpg" / f"{name}.jpg" for name in names]
        labels += [label] * len(names)
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise DatasetLayoutError(f"{len(missing)} images listed in {csv_path} do not exist, e.g. {missing[0]}; {layout}")
    return ClassLabelledImages(f"{DATASET}_{root.name}", tuple(paths), np.asarray(labels, dtype=np.int64))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Generate the aggzoo synthetic landmark set (revisitop layout).")
    parser.add_argument("--root", type=Path, default=None, help="output folder (default: the cache folder)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--force", action="store_true", help="regenerate even if a complete copy exists")
    args = parser.parse_args(argv)
    config = SyntheticLandmarksConfig(seed=args.seed)
    root = args.root if args.root is not None else default_landmarks_root(config)
    start = time.perf_counter()
    if args.force:
        generate_synthetic_landmarks(root, config, workers=args.workers)
    else:
        ensure_synthetic_landmarks(root, config, workers=args.workers)
    elapsed = time.perf_counter() - start
    with open(root / GND_FILE, "rb") as fh:
        gnd = pickle.load(fh)  # our own file, just written
    print(f"synthetic landmarks at {root}: {len(gnd['imlist'])} database images, {len(gnd['qimlist'])} queries "
          f"of {config.landmarks} landmarks in {elapsed:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
