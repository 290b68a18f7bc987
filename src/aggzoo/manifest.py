"""``weights/manifest.json``: the weights aggzoo ships, and the command that (re)makes each file.

Format (``"format": "aggzoo.weights-manifest/1"``), one object per shipped file under ``"entries"``::

    {
      "name": "gem_efficientnet_lite0.nordland_mini",   # <registered architecture>.<tag>
      "file": "gem_efficientnet_lite0.nordland_mini.safetensors",   # inside weights/
      "sha256": "<64 hex digits of the file>",
      "contents": "delta",          # "full": every tensor; "delta": only what differs from the
                                    # model built with its pretrained (ImageNet) backbone
      "model_kwargs": {},           # entry-point arguments of this variant (may be empty)
      "input_size": [3, 112, 224], "mean": [...], "std": [...], "interpolation": "bicubic",
      "out_dim": 112,
      "recipe": "python train.py experiment=... seed=0",          # what trained it
      "command": "python -m aggzoo.manifest add ...",             # what wrote this entry
      "license": "Apache-2.0",
      "metrics": {"nordland_mini/R@1": 5.3},                     # measured, in percent
      "evaluation": {                                            # how the metrics were measured
        "dataset": "nordland_mini",        # or "synthetic" (the embedded generator)
        "split": "test",
        "image_size": [112, 224],
        "synthetic": {...},                # SyntheticCityConfig fields, for "synthetic" only
        "tolerance": 0.5                   # |re-measured - recorded| allowed, in points
      },
      "notes": "..."
    }

Each entry becomes a registered tag (a :class:`~aggzoo.pretrained.PretrainedCfg` with
``file=...``), so ``aggzoo.create_model("<name>", pretrained=True)`` loads it offline.

Regenerating a file (after ``python train.py ...`` wrote a Lightning checkpoint)::

    python -m aggzoo.manifest add <name> <checkpoint.ckpt> --recipe "python train.py ..." \\
        --metrics results.json [--dataset nordland_mini --image-size 112 224] [--contents delta]

``add`` rebuilds the architecture, loads the checkpoint strictly, writes the safetensors file
(only the tensors that differ from the pretrained backbone with ``--contents delta``), hashes it,
evaluates nothing itself (the metrics come from the training run's results file) and updates the
entry in place. ``python -m aggzoo.manifest verify`` re-hashes and strictly loads every entry.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aggzoo.pretrained import IMAGENET_MEAN, IMAGENET_STD, PretrainedCfg

__all__ = [
    "MANIFEST_FORMAT",
    "ManifestEntry",
    "ManifestError",
    "manifest_path",
    "read_manifest",
    "register_manifest",
    "write_manifest",
]

MANIFEST_FORMAT = "aggzoo.weights-manifest/1"
MANIFEST_FILE = "manifest.json"
_DATASETS = ("nordland_mini", "synthetic")


class ManifestError(ValueError):
    """``weights/manifest.json`` is malformed."""


@dataclass(frozen=True)
class ManifestEntry:
    """One shipped weights file (see the module docstring for the JSON form)."""

    name: str
    file: str
    sha256: str
    contents: str = "delta"
    model_kwargs: Mapping[str, Any] = field(default_factory=dict)
    input_size: tuple[int, int, int] = (3, 224, 224)
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    interpolation: str = "bicubic"
    out_dim: int | None = None
    recipe: str | None = None
    command: str | None = None
    license: str | None = "Apache-2.0"
    metrics: Mapping[str, float] = field(default_factory=dict)
    evaluation: Mapping[str, Any] = field(default_factory=dict)
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
        if "." not in data["name"]:
            raise ManifestError(f"{where}: name {data['name']!r} must read '<architecture>.<tag>'")
        if Path(data["file"]).name != data["file"]:
            raise ManifestError(f"{where}: file {data['file']!r} must be a bare file name inside weights/")
        evaluation = data.get("evaluation") or {}
        if evaluation and evaluation.get("dataset") not in _DATASETS:
            raise ManifestError(f"{where}: evaluation.dataset must be one of {list(_DATASETS)}")
        values = dict(data)
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
        )


def manifest_path() -> Path:
    from aggzoo.hub import weights_dir

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
    path = Path(path) if path is not None else manifest_path()
    data = {"format": MANIFEST_FORMAT, "entries": [e.to_json() for e in sorted(entries, key=lambda e: e.name)]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def register_manifest(path: str | os.PathLike | None = None) -> list[str]:
    """Register every manifest entry as a pretrained tag; returns their names."""
    from aggzoo.registry import register_pretrained

    return [register_pretrained(e.name, e.to_pretrained_cfg()).name for e in read_manifest(path)]


# ---------------------------------------------------------------------------------------------
# python -m aggzoo.manifest add | verify


def _delta(model: Any, reference: Any) -> dict[str, Any]:
    """Tensors of ``model`` that are not bit-identical to ``reference``'s, every head tensor kept."""
    import torch

    base = reference.state_dict()
    out = {}
    for key, tensor in model.state_dict().items():
        if key.startswith("head.") or key not in base or not torch.equal(tensor, base[key]):
            out[key] = tensor
    return out


def add_entry(
    name: str,
    checkpoint: str | os.PathLike,
    *,
    recipe: str,
    metrics: Mapping[str, float],
    evaluation: Mapping[str, Any] | None = None,
    contents: str = "delta",
    input_size: Sequence[int] | None = None,
    notes: str | None = None,
    command: str | None = None,
    directory: str | os.PathLike | None = None,
) -> ManifestEntry:
    """Write ``<name>.safetensors`` from a training checkpoint and upsert its manifest entry."""
    from safetensors.torch import save_file

    from aggzoo.hub import load_checkpoint, sha256_of, weights_dir
    from aggzoo.pretrained import split_name
    from aggzoo.registry import create_model

    architecture, tag = split_name(name)
    if tag is None:
        raise ManifestError(f"name {name!r} must read '<architecture>.<tag>'")
    folder = Path(directory) if directory is not None else weights_dir()
    model = create_model(architecture, pretrained_backbone=contents == "delta")
    _check_same_architecture(model, checkpoint)
    load_checkpoint(model, checkpoint)
    if contents == "delta":
        reference = create_model(architecture, pretrained_backbone=True)
        tensors = _delta(model, reference)
    else:
        tensors = dict(model.state_dict())
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()}
    filename = f"{name}.safetensors"
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / filename), metadata={"name": name, "recipe": recipe})
    size = tuple(input_size) if input_size is not None else None
    if size is None and evaluation and "image_size" in evaluation:
        size = (3, *evaluation["image_size"])
    entry = ManifestEntry(
        name=name, file=filename, sha256=sha256_of(folder / filename), contents=contents,
        input_size=size or (3, 224, 224), out_dim=int(model.out_dim), recipe=recipe, command=command,
        metrics=dict(metrics), evaluation=dict(evaluation or {}), notes=notes,
        **_backbone_preprocessing(model),
    )
    manifest = folder / MANIFEST_FILE
    entries = [e for e in read_manifest(manifest) if e.name != name] + [entry]
    write_manifest(entries, manifest)
    return entry


def _check_same_architecture(model: Any, checkpoint: str | os.PathLike) -> None:
    """A pipeline checkpoint records the backbone + head config it was trained with: it must be
    the registered architecture's (the backbone's ``pretrained`` flag aside), or the shipped file
    would be loaded into a different model than the one that was measured."""
    from aggzoo.hub import CheckpointError, read_spec
    from aggzoo.registry import normalise_spec

    try:
        trained = normalise_spec(read_spec(checkpoint))
    except CheckpointError:
        return  # a bare state dict: strict loading is the only check available
    registered = normalise_spec(model.aggzoo_spec)
    for spec in (trained, registered):
        spec["backbone"].pop("pretrained", None)
    if trained != registered:
        raise ManifestError(
            f"{checkpoint} was trained with {json.dumps(trained, sort_keys=True)}, but the registered "
            f"architecture is {json.dumps(registered, sort_keys=True)}; register a matching entry point "
            "or train with the registered configuration"
        )


def _backbone_preprocessing(model: Any) -> dict[str, Any]:
    timm_cfg = getattr(model.backbone, "pretrained_cfg", None) or {}
    out: dict[str, Any] = {}
    if "mean" in timm_cfg and "std" in timm_cfg:
        out["mean"], out["std"] = tuple(timm_cfg["mean"]), tuple(timm_cfg["std"])
    if "interpolation" in timm_cfg:
        out["interpolation"] = timm_cfg["interpolation"]
    return out


def verify(path: str | os.PathLike | None = None) -> list[str]:
    """Re-hash and strictly load every entry; returns one line per entry."""
    from aggzoo.registry import create_model

    lines = []
    for entry in read_manifest(path):
        model = create_model(entry.name, pretrained=True)
        lines.append(f"{entry.name}: ok ({entry.file}, out_dim {model.out_dim})")
    return lines


def _metrics_arg(value: str) -> dict[str, float]:
    path = Path(value)
    data = json.loads(path.read_text()) if path.is_file() else json.loads(value)
    if not isinstance(data, dict) or not all(isinstance(v, (int, float)) for v in data.values()):
        raise argparse.ArgumentTypeError("--metrics takes a JSON object (or a file holding one) of name -> number")
    return {str(k): float(v) for k, v in data.items()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m aggzoo.manifest", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    add = sub.add_parser("add", help="write weights/<name>.safetensors from a checkpoint and update the manifest")
    add.add_argument("name", help="<architecture>.<tag>, e.g. gem_efficientnet_lite0.nordland_mini")
    add.add_argument("checkpoint", help="a Lightning checkpoint of aggzoo's pipeline (or any aggzoo state dict)")
    add.add_argument("--recipe", required=True, help="the command that trained it")
    add.add_argument("--metrics", required=True, type=_metrics_arg,
                     help='JSON object or file: {"nordland_mini/R@1": 5.3}')
    add.add_argument("--dataset", choices=_DATASETS, help="where the metrics were measured")
    add.add_argument("--split", default="test")
    add.add_argument("--image-size", type=int, nargs=2, metavar=("H", "W"))
    add.add_argument("--synthetic-config", type=json.loads, default=None,
                     help="for --dataset synthetic: the SyntheticCityConfig fields as JSON (conf/synthetic)")
    add.add_argument("--tolerance", type=float, default=0.5, help="allowed |re-measured - recorded| in points")
    add.add_argument("--contents", choices=("delta", "full"), default="delta")
    add.add_argument("--notes")
    sub.add_parser("verify", help="re-hash and strictly load every manifest entry")
    args = parser.parse_args(argv)
    if args.command == "verify":
        for line in verify():
            print(line)
        return 0
    evaluation = None
    if args.dataset is not None:
        evaluation = {"dataset": args.dataset, "split": args.split, "tolerance": args.tolerance}
        if args.image_size:
            evaluation["image_size"] = list(args.image_size)
        if args.synthetic_config is not None:
            evaluation["synthetic"] = {k: v for k, v in args.synthetic_config.items() if not k.startswith("_")}
    entry = add_entry(
        args.name, args.checkpoint, recipe=args.recipe, metrics=args.metrics, evaluation=evaluation,
        contents=args.contents, notes=args.notes,
        command="python -m aggzoo.manifest " + " ".join(sys.argv[1:] if argv is None else argv),
    )
    print(json.dumps(entry.to_json(), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
