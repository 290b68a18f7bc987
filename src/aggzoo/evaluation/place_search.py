"""Place search for one query at a time: what the web demo (``python -m aggzoo.cli.demo``) runs.

A database folder is described once (:func:`load_place_database`), its descriptors extracted and put
in the one search interface (:func:`~aggzoo.evaluation.index.build_index`, FAISS exact; the torch
fallback without FAISS), and each query image is answered with its top-k database images, their
inner-product scores and -- when the file names carry VG-style UTM coordinates
(``@east@north@...``) -- the distance in metres from the query and whether it counts as correct
(within the radius of the published protocols, 25 m). Plain functions and data, no web framework:
the demo's Gradio layer only displays what these return.

Folders taken as a database:

- a VG split (``<folder>/database/`` + optional ``<folder>/queries/``, as ``images/test`` of every
  dataset of gmberton's downloader and of the synthetic city): the database images, and the
  queries offered as examples, each with its ground truth from the names;
- a VG dataset root (``<folder>/images/<split>/database``): its ``test`` split (else the only one);
- any other folder: every image under it (recursively) is a database image; uploads are the queries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageOps
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torch import nn

from aggzoo.data.images import read_rgb
from aggzoo.data.layout import IMAGE_EXTENSIONS, list_images
from aggzoo.data.transforms import eval_transform
from aggzoo.data.vg import utm_from_name
from aggzoo.errors import DatasetFormatError, DatasetLayoutError
from aggzoo.evaluation.extraction import extract_descriptors
from aggzoo.evaluation.index import build_index, faiss_available
from aggzoo.evaluation.options import ExtractionOptions
from aggzoo.evaluation.search import search_with_scores
from aggzoo.models.modes import evaluating

__all__ = ["Match", "PlaceDatabase", "PlaceSearch", "load_place_database", "position_from_name", "model_card",
           "matches_markdown", "match_caption", "framed_thumbnail", "FRAME_COLOURS"]

#: Frame of a result: a positive (within the radius), not one, or unknown (no coordinates).
FRAME_COLOURS = {True: (44, 160, 44), False: (214, 39, 40), None: (150, 150, 150)}


def position_from_name(path: str | Path) -> tuple[float, float] | None:
    """``(east, north)`` in metres from a VG file name ``@east@north@...``, or ``None`` for other names."""
    try:
        return utm_from_name(path)
    except DatasetFormatError:
        return None


@dataclass(frozen=True)
class PlaceDatabase:
    """The images to search and what is known about them.

    Attributes:
        root: the folder given.
        paths: ``N`` database images.
        positions: ``[N, 2]`` UTM east/north (metres) when every name carries them, else ``None``.
        example_queries: query images found beside the database (a VG split's ``queries/``).
        radius_m: a result within this distance of the query is correct.
    """

    root: Path
    paths: tuple[Path, ...]
    positions: np.ndarray | None
    example_queries: tuple[Path, ...]
    radius_m: float = 25.0


def _vg_split(folder: Path) -> Path | None:
    if (folder / "database").is_dir():
        return folder
    splits = sorted(p for p in (folder / "images").glob("*") if (p / "database").is_dir())
    if not splits:
        return None
    return next((p for p in splits if p.name == "test"), splits[0])


def load_place_database(folder: str | Path, *, radius_m: float = 25.0) -> PlaceDatabase:
    """Describe ``folder`` as a database (see the module docstring for the layouts it reads)."""
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise DatasetLayoutError(f"database={folder}: no such folder. Pass a folder of images, or a VG split "
                                 "(a folder with database/ and queries/, e.g. <dataset>/images/test)")
    split = _vg_split(root)
    paths = list_images(split / "database") if split is not None else list_images(root)
    queries = list_images(split / "queries") if split is not None and (split / "queries").is_dir() else ()
    if not paths:
        raise DatasetLayoutError(f"database={folder}: no images ({', '.join(IMAGE_EXTENSIONS)}) under "
                                 f"{split / 'database' if split is not None else root}. Pass a folder of images, "
                                 "or a VG split with database/ and queries/")
    found = [position_from_name(p) for p in paths]
    positions = np.array(found, dtype=np.float64) if all(p is not None for p in found) else None
    return PlaceDatabase(root=root, paths=paths, positions=positions, example_queries=queries, radius_m=radius_m)


@dataclass(frozen=True)
class Match:
    """One retrieved database image.

    Attributes:
        rank: 1 for the best.
        index: row in the database.
        path: the image.
        score: inner product of the L2-normalised descriptors (cosine similarity).
        distance_m: metres between the query and this image (both names carry UTM), else ``None``.
        correct: ``distance_m <= radius``, or ``None`` when the distance is unknown.
    """

    rank: int
    index: int
    path: Path
    score: float
    distance_m: float | None
    correct: bool | None


def _preprocessing(model: nn.Module, image_size: Sequence[int] | None) -> dict[str, Any]:
    cfg = getattr(model, "pretrained_cfg", None)
    size = tuple(image_size) if image_size is not None else (tuple(cfg.input_size[1:]) if cfg is not None else (224, 224))
    return {"image_size": size,
            "mean": tuple(cfg.mean) if cfg is not None else IMAGENET_DEFAULT_MEAN,
            "std": tuple(cfg.std) if cfg is not None else IMAGENET_DEFAULT_STD,
            "interpolation": cfg.interpolation if cfg is not None else "bicubic"}


class PlaceSearch:
    """A model and a database, indexed: ``query(image) -> [Match, ...]``.

    Args:
        model: ``images [B, 3, H, W] -> descriptors [B, D]`` (L2-normalised).
        database: from :func:`load_place_database`.
        image_size: ``(H, W)`` the images are resized to; default the model's ``pretrained_cfg.input_size``
            (what its recorded metrics were measured at), else 224 x 224.
        batch_size, device: of the database extraction.
    """

    def __init__(self, model: nn.Module, database: PlaceDatabase, *, image_size: Sequence[int] | None = None,
                 batch_size: int = 32, device: str | torch.device | None = None) -> None:
        self.model = model
        self.database = database
        self.preprocessing = _preprocessing(model, image_size)
        self.transform = eval_transform(self.preprocessing["image_size"], mean=self.preprocessing["mean"],
                                        std=self.preprocessing["std"], interpolation=self.preprocessing["interpolation"])
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        model.to(self.device)
        extraction = ExtractionOptions(batch_size=batch_size, device=str(self.device))
        self.descriptors = extract_descriptors(model, database.paths, self.transform, extraction, desc="database")  # [N, D]
        # Built once, searched for every query; without FAISS the exact torch search takes the matrix.
        self.index: Any = build_index(self.descriptors) if faiss_available() else None

    def describe(self, image: np.ndarray) -> np.ndarray:
        """``uint8 [H, W, 3]`` RGB -> ``[1, D]`` descriptor."""
        batch = self.transform(image).unsqueeze(0).to(self.device)
        with evaluating(self.model), torch.inference_mode():
            return self.model(batch).float().cpu().numpy()

    def query(self, image: str | Path | np.ndarray, k: int = 5, *, position: tuple[float, float] | None = None
              ) -> list[Match]:
        """The top-``k`` database images for ``image`` (a file, or ``uint8 [H, W, 3]`` RGB).

        ``position`` (UTM east, north) defaults to the one in the file's name, if any.
        """
        if isinstance(image, str | Path):
            position = position if position is not None else position_from_name(image)
            image = read_rgb(image)
        k = max(1, min(int(k), len(self.database.paths)))
        scores, ids = search_with_scores(self.descriptors, self.describe(image), k, prebuilt=self.index)
        matches = []
        for rank, (index, score) in enumerate(zip(ids[0].tolist(), scores[0].tolist()), start=1):
            distance = None
            if position is not None and self.database.positions is not None:
                distance = float(np.hypot(*(self.database.positions[index] - np.asarray(position))))
            correct = None if distance is None else distance <= self.database.radius_m
            matches.append(Match(rank, index, self.database.paths[index], float(score), distance, correct))
        return matches


def framed_thumbnail(path: str | Path, correct: bool | None, *, height: int = 160, border: int = 6) -> Image.Image:
    """The image at ``path`` scaled to ``height`` px, in a frame of :data:`FRAME_COLOURS` (green: correct,
    red: not, grey: unknown)."""
    image = Image.fromarray(read_rgb(path))
    width = max(1, round(image.width * height / image.height))
    image = image.resize((width, height), Image.Resampling.BICUBIC)
    return ImageOps.expand(image, border=border, fill=FRAME_COLOURS[correct])


def _verdict(match: Match) -> str:
    return {True: "correct", False: "wrong", None: "unknown"}[match.correct]


def match_caption(match: Match) -> str:
    """``#1 · 0.873 · correct · 3.2 m`` (the distance only when known)."""
    parts = [f"#{match.rank}", f"{match.score:.3f}", _verdict(match)]
    if match.distance_m is not None:
        parts.append(f"{match.distance_m:.1f} m")
    return " · ".join(parts)


def matches_markdown(matches: Sequence[Match], database: PlaceDatabase, query_position: tuple[float, float] | None
                     ) -> str:
    """A Markdown table of the results, with a line on what the ground truth is."""
    if query_position is None or database.positions is None:
        truth = ("No ground truth: the query's or the database's file names carry no UTM coordinates "
                 "(`@east@north@...`), so results are not marked correct or wrong.")
    else:
        near = int(np.sum(np.hypot(*(database.positions - np.asarray(query_position)).T) <= database.radius_m))
        found = next((m.rank for m in matches if m.correct), None)
        where = f"the first at rank {found}" if found else f"none in the top {len(matches)}"
        truth = (f"Query at UTM ({query_position[0]:.1f}, {query_position[1]:.1f}): {near} database image(s) within "
                 f"{database.radius_m:g} m; {where}.")
    rows = ["| rank | score | verdict | distance | file |", "|---:|---:|---|---:|---|"]
    for m in matches:
        distance = f"{m.distance_m:.1f} m" if m.distance_m is not None else "-"
        name = m.path.name if len(m.path.name) <= 40 else m.path.name[:20] + "…" + m.path.name[-19:]
        rows.append(f"| {m.rank} | {m.score:.3f} | {_verdict(m)} | {distance} | `{name}` |")
    return truth + "\n\n" + "\n".join(rows)


def model_card(model: nn.Module, name: str) -> str:
    """Markdown: what ``model`` is (its ``pretrained_cfg``: paper, code, licence, D, input size,
    recipe, recorded results), or the architecture alone for a model without one."""
    cfg = getattr(model, "pretrained_cfg", None)
    out_dim = getattr(model, "out_dim", None)
    lines = [f"### {name}", ""]
    if cfg is None:
        architecture = getattr(model, "aggzoo_architecture", None) or type(model).__name__
        lines += [f"- architecture: `{architecture}`", f"- descriptor size D: {out_dim}",
                  "- no recorded provenance (no `pretrained_cfg`): weights as loaded from the given file, "
                  "or untrained when a bare architecture was named"]
        return "\n".join(lines)
    fields = [("paper", cfg.paper), ("code", cfg.code), ("licence", cfg.license), ("descriptor size D", cfg.out_dim or out_dim),
              ("input size (H x W)", " x ".join(str(v) for v in cfg.input_size[1:])), ("weights", cfg.source),
              ("recipe", f"`{cfg.recipe}`" if cfg.recipe else None), ("notes", cfg.notes)]
    lines += [f"- {label}: {value}" for label, value in fields if value]
    if cfg.metrics:
        lines += ["", "| benchmark | metric | value (%) |", "|---|---|---:|"]
        for key, value in cfg.metrics.items():
            benchmark, _, metric = key.rpartition("/")
            lines.append(f"| {benchmark} | {metric} | {value:g} |")
    return "\n".join(lines)
