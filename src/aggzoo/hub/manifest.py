"""``weights/manifest.json``: the weights aggzoo ships, and the command that (re)makes each file.

Format (``"format": "aggzoo.weights-manifest/1"``), one object per shipped file under ``"entries"``::

    {
      "name": "netvlad_efficientnet_lite0.nordland_mini",   # <registered architecture>.<tag>
      "file": "netvlad_efficientnet_lite0.nordland_mini.safetensors",   # inside weights/
      "sha256": "<64 hex digits of the file>",
      "contents": "delta",          # "full": every tensor; "delta": only what differs from the
                                    # model built with its pretrained (ImageNet) backbone
      "model_kwargs": {},           # entry-point arguments of this variant (may be empty)
      "input_size": [3, 112, 224], "mean": [...], "std": [...], "interpolation": "bicubic",
      "out_dim": 7168,
      "recipe": "python train.py experiment=... seed=0",          # what trained it
      "command": "python -m aggzoo.cli.manifest add ...",           # what wrote this entry
      "license": "Apache-2.0",
      "metrics": {"nordland_mini/R@1": 5.3},                     # measured, in percent
      "evaluation": {                                            # how the metrics were measured
        "dataset": "nordland_mini",        # or "synthetic" (the embedded generator)
        "split": "test",
        "image_size": [112, 224],
        "synthetic": {...},                # SyntheticCityConfig fields, for "synthetic" only
        "tolerance": 0.5                   # |re-measured - recorded| allowed, in points
      },
      "off_domain": [                                            # optional: data it was never trained on
        {"dataset": "synthetic", "split": "test", "image_size": [120, 160],
         "synthetic": {...},               # for "synthetic" only
         "recalls": {"R@1": 40.0, "R@5": ..., "R@10": ...},        # this head, in percent
         "baseline": "avgpool_efficientnet_lite0",                 # its backbone's ImageNet GAP baseline
         "baseline_recalls": {"R@1": 30.0, ...},                   # same set, size and cut-offs
         "command": "python -m aggzoo.cli.manifest off-domain ..."}
      ],
      "notes": "..."
    }

``off_domain`` (absent in older manifests, which stay readable) is what shows that shipped weights
generalise: each record is measured on a dataset other than the one of ``evaluation`` by
``python -m aggzoo.cli.manifest off-domain``, with the baseline at the same image size.

Each entry becomes a registered tag (a :class:`~aggzoo.hub.cfg.PretrainedCfg` with
``file=...``), so ``aggzoo.create_model("<name>", pretrained=True)`` loads it offline.

This module is the format only; the commands that write and check entries (``python -m
aggzoo.cli.manifest add | verify``) live in :mod:`aggzoo.cli.manifest`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

from aggzoo.errors import ManifestError
from aggzoo.hub.cfg import PretrainedCfg
from aggzoo.hub.download import weights_dir
from aggzoo.hub.registry import register_pretrained

__all__ = [
    "DATASETS",
    "MANIFEST_FILE",
    "MANIFEST_FORMAT",
    "OFF_DOMAIN_FIELDS",
    "ManifestEntry",
    "manifest_path",
    "read_manifest",
    "register_manifest",
    "write_manifest",
]

MANIFEST_FORMAT = "aggzoo.weights-manifest/1"
MANIFEST_FILE = "manifest.json"
DATASETS = ("nordland_mini", "synthetic")
OFF_DOMAIN_FIELDS = ("dataset", "split", "image_size", "synthetic", "recalls", "baseline", "baseline_recalls",
                     "command")


@dataclass(frozen=True)
class ManifestEntry:
    """One shipped weights file (see the module docstring for the JSON form)."""

    name: str
    file: str
    sha256: str
    contents: str = "delta"
    model_kwargs: Mapping[str, Any] = field(default_factory=dict)
    input_size: tuple[int, int, int] = (3, 224, 224)
    mean: tuple[float, float, float] = IMAGENET_DEFAULT_MEAN
    std: tuple[float, float, float] = IMAGENET_DEFAULT_STD
    interpolation: str = "bicubic"
    out_dim: int | None = None
    recipe: str | None = None
    command: str | None = None
    license: str | None = "Apache-2.0"
    metrics: Mapping[str, float] = field(default_factory=dict)
    evaluation: Mapping[str, Any] = field(default_factory=dict)
    off_domain: tuple[Mapping[str, Any], ...] = ()
    notes: str | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str) -> ManifestEntry:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ManifestError(f"{where}: unknown fields {unknown}; expected a subset of {sorted(known)}")
        for required in ("name", "file", "sha256"):
            if not isinstance(data.get(required), str) or not data[required]:
                raise ManifestError(f"{where}: {required!r} must be a non-empty string")
        if not re.fullmatch(r"[0-9a-f]{64}", data["sha256"]):
            raise ManifestError(f"{where}: sha256 must be the 64 lowercase hex digits of the file (sha256sum "
                                f"weights/{data['file']}), got {data['sha256']!r}")
        if "." not in data["name"]:
            raise ManifestError(f"{where}: name {data['name']!r} must read '<architecture>.<tag>'")
        if Path(data["file"]).name != data["file"]:
            raise ManifestError(f"{where}: file {data['file']!r} must be a bare file name inside weights/")
        evaluation = data.get("evaluation") or {}
        if evaluation and evaluation.get("dataset") not in DATASETS:
            raise ManifestError(f"{where}: evaluation.dataset must be one of {list(DATASETS)}")
        values = dict(data)
        if "off_domain" in values:
            values["off_domain"] = _off_domain_records(values["off_domain"], evaluation, where)
        for key in ("input_size", "mean", "std"):
            if key in values:
                values[key] = tuple(values[key])
        return cls(**values)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key in self.__dataclass_fields__:
            value = getattr(self, key)
            if isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, Mapping):
                value = dict(value)
            out[key] = value
        return out

    def to_pretrained_cfg(self) -> PretrainedCfg:
        return PretrainedCfg(
            file=self.file, sha256=self.sha256, contents=self.contents, model_kwargs=self.model_kwargs,
            input_size=self.input_size, mean=self.mean, std=self.std, interpolation=self.interpolation,
            out_dim=self.out_dim, recipe=self.recipe, license=self.license, metrics=self.metrics,
            notes=self.notes, code="aggzoo (trained by the project)",
            # the metrics were measured by the train job's test step, with the pipeline's resize
            eval_resize="pipeline",
        )


def _off_domain_records(records: Any, evaluation: Mapping[str, Any], where: str) -> tuple[dict[str, Any], ...]:
    """Check the ``off_domain`` list (see the module docstring); returns it as a tuple of dicts."""
    if not isinstance(records, list):
        raise ManifestError(f"{where}: off_domain must be a list of records, got {type(records).__name__}")
    out = []
    for i, record in enumerate(records):
        at = f"{where} off_domain[{i}]"
        if not isinstance(record, dict):
            raise ManifestError(f"{at}: must be an object with the fields {list(OFF_DOMAIN_FIELDS)}")
        unknown = sorted(set(record) - set(OFF_DOMAIN_FIELDS))
        missing = sorted(set(OFF_DOMAIN_FIELDS) - {"synthetic"} - set(record))
        if unknown or missing:
            raise ManifestError(f"{at}: unknown fields {unknown}, missing fields {missing}; rewrite it with "
                                "python -m aggzoo.cli.manifest off-domain")
        if record["dataset"] not in DATASETS:
            raise ManifestError(f"{at}: dataset must be one of {list(DATASETS)}, got {record['dataset']!r}")
        if record["dataset"] == evaluation.get("dataset"):
            # The point of the record is data the head never saw: its own dataset is the in-domain metric.
            raise ManifestError(f"{at}: dataset {record['dataset']!r} is the entry's own evaluation dataset; "
                                "off_domain records another one")
        size = record["image_size"]
        if not (isinstance(size, list) and len(size) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in size)):
            raise ManifestError(f"{at}: image_size must be [H, W] (two positive integers), got {size!r}")
        for key in ("split", "baseline", "command"):
            if not isinstance(record[key], str) or not record[key]:
                raise ManifestError(f"{at}: {key} must be a non-empty string")
        recalls, baseline = record["recalls"], record["baseline_recalls"]
        for key, values in (("recalls", recalls), ("baseline_recalls", baseline)):
            if not (isinstance(values, dict) and values and all(
                    re.fullmatch(r"R@[1-9][0-9]*", k) and isinstance(v, (int, float)) and not isinstance(v, bool)
                    and 0.0 <= v <= 100.0 for k, v in values.items())):
                raise ManifestError(f"{at}: {key} must map 'R@<k>' to a percentage in [0, 100], got {values!r}")
        if set(recalls) != set(baseline):
            raise ManifestError(f"{at}: recalls {sorted(recalls)} and baseline_recalls {sorted(baseline)} must "
                                "have the same cut-offs (measured together)")
        out.append(dict(record))
    return tuple(out)


def manifest_path() -> Path:
    """``manifest.json`` in the shipped weights folder (``AGGZOO_WEIGHTS_DIR`` when set)."""
    return weights_dir() / MANIFEST_FILE


def read_manifest(path: str | os.PathLike | None = None) -> list[ManifestEntry]:
    """Parse the manifest (a missing file is an empty manifest)."""
    path = Path(path) if path is not None else manifest_path()
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ManifestError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
        raise ManifestError(f"{path}: expected an object with \"format\": \"{MANIFEST_FORMAT}\"")
    entries = data.get("entries")
    if not isinstance(entries, list):
        raise ManifestError(f"{path}: \"entries\" must be a list")
    parsed = [ManifestEntry.from_json(e, f"{path} entry {i}") for i, e in enumerate(entries)]
    names = [e.name for e in parsed]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ManifestError(f"{path}: names listed twice: {duplicates}")
    return parsed


def write_manifest(entries: Sequence[ManifestEntry], path: str | os.PathLike | None = None) -> Path:
    """Write ``entries`` (sorted by name) as the manifest at ``path`` (default: :func:`manifest_path`); returns the path."""
    path = Path(path) if path is not None else manifest_path()
    data = {"format": MANIFEST_FORMAT, "entries": [e.to_json() for e in sorted(entries, key=lambda e: e.name)]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def register_manifest(path: str | os.PathLike | None = None) -> list[str]:
    """Register every manifest entry as a pretrained tag; returns their names."""
    return [register_pretrained(e.name, e.to_pretrained_cfg()).name for e in read_manifest(path)]
