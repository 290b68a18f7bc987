"""``python -m aggzoo.cli.manifest add | verify | off-domain``: write and check the entries of ``weights/manifest.json``.

Regenerating a file (after ``python train.py ...`` wrote a Lightning checkpoint)::

    python -m aggzoo.cli.manifest add <name> <checkpoint.ckpt> --recipe "python train.py ..." \\
        --metrics results.json [--dataset nordland_mini --image-size 112 224] [--contents delta]

``add`` rebuilds the architecture, loads the checkpoint strictly, writes the safetensors file
(only the tensors that differ from the pretrained backbone with ``--contents delta``), hashes it,
evaluates nothing itself (the metrics come from the training run's results file) and updates the
entry in place. ``verify`` re-hashes and strictly loads every entry. ``off-domain`` measures a
shipped entry on a dataset it was not trained on, beside the ImageNet global-average-pooling
baseline of its backbone (``avgpool_<backbone>``) at the same image size, and records both in the
entry's ``off_domain`` list::

    python -m aggzoo.cli.manifest off-domain netvlad_efficientnet_lite0.synthetic --dataset nordland_mini

The image size (and synthetic config) default to the target dataset's own protocol: those of the
manifest entry evaluated in-domain there. The format is :mod:`aggzoo.hub.manifest`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from aggzoo.cli.reporting import reported_user_errors
from aggzoo.errors import DatasetLayoutError, ManifestError
from aggzoo.hub.cfg import split_name
from aggzoo.hub.checkpoint import read_checkpoint, sha256_of
from aggzoo.hub.download import weights_dir
from aggzoo.hub.factory import create_model
from aggzoo.hub.loading import load_checkpoint
from aggzoo.hub.manifest import DATASETS, MANIFEST_FILE, ManifestEntry, read_manifest, write_manifest
from aggzoo.hub.saving import save_weights

__all__ = ["add_entry", "main", "measure_off_domain", "verify"]

#: Recall cut-offs of an off-domain record.
OFF_DOMAIN_KS = (1, 5, 10)


def _delta(model: Any, reference: Any) -> dict[str, Any]:
    """Tensors of ``model`` that are not bit-identical to ``reference``'s, every head tensor kept."""
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
    filename = f"{name}.safetensors"
    folder.mkdir(parents=True, exist_ok=True)
    save_weights(tensors, folder / filename, metadata={"name": name, "recipe": recipe})
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
    the registered architecture's (the backbone's ``pretrained`` and ``frozen_stages`` aside), or the shipped file
    would be loaded into a different model than the one that was measured."""
    trained = read_checkpoint(checkpoint).spec
    if trained is None:
        return  # a bare state dict: strict loading is the only check available
    trained = dict(trained, backbone=dict(trained["backbone"]))
    registered = dict(model.aggzoo_spec, backbone=dict(model.aggzoo_spec["backbone"]))
    # Neither flag changes the function the tensors compute: ``pretrained`` is where the initial backbone
    # came from, ``frozen_stages`` which stages trained (an inference model is all in eval mode).
    for spec in (trained, registered):
        for key in ("pretrained", "frozen_stages"):
            spec["backbone"].pop(key, None)
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
    lines = []
    for entry in read_manifest(path):
        model = create_model(entry.name, pretrained=True)
        lines.append(f"{entry.name}: ok ({entry.file}, out_dim {model.out_dim})")
    return lines


def _target_protocol(entries: Sequence[ManifestEntry], dataset: str) -> dict[str, Any]:
    """The evaluation block of the entry measured in-domain on ``dataset`` (its own protocol), or {}."""
    for entry in entries:
        if entry.evaluation.get("dataset") == dataset:
            return dict(entry.evaluation)
    return {}


def _retrieval_set(dataset: str, split: str, synthetic: Mapping[str, Any] | None, root: str | os.PathLike | None):
    from aggzoo.data.vg import load_vg

    if dataset == "nordland_mini":
        shared = os.environ.get("AGGZOO_SHARED_DATA", "").strip() or os.path.join("..", "shared", "data")
        folder = Path(root) if root is not None else Path(shared) / "nordland_mini" / "vg"
        if not folder.is_dir():
            raise DatasetLayoutError(f"nordland_mini not found at {folder}: pass --root <nordland_mini/vg> "
                                     "or set AGGZOO_SHARED_DATA to the folder holding nordland_mini/")
    else:
        from aggzoo.data.synthetic import SyntheticCityConfig, ensure_synthetic_city

        folder = ensure_synthetic_city(root, config=SyntheticCityConfig(**(synthetic or {}))) / "vg"
    # 25 m: the positive radius of every VG-layout benchmark (and of the in-domain metric).
    return load_vg(folder, split=split, positive_radius_m=25.0)


def measure_off_domain(
    name: str,
    dataset: str,
    *,
    split: str = "test",
    image_size: Sequence[int] | None = None,
    synthetic: Mapping[str, Any] | None = None,
    root: str | os.PathLike | None = None,
    command: str | None = None,
    path: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Measure shipped ``name`` and its backbone's GAP baseline on ``dataset`` and record the result.

    Both models see the same retrieval set through the same eval transform (``image_size`` [H, W],
    the entry's normalisation); the baseline is ``avgpool_<backbone>`` with its pretrained (ImageNet)
    backbone and no training. Upserts the record (one per dataset and split) into the entry's
    ``off_domain`` list and rewrites the manifest; returns the record.
    """
    from dataclasses import replace

    from aggzoo.data.transforms import eval_transform
    from aggzoo.evaluation.loop import evaluate_retrieval
    from aggzoo.evaluation.options import EvaluationOptions

    manifest = Path(path) if path is not None else weights_dir() / MANIFEST_FILE
    entries = read_manifest(manifest)
    entry = next((e for e in entries if e.name == name), None)
    if entry is None:
        raise ManifestError(f"{manifest} has no entry {name!r}; known: {[e.name for e in entries]}")
    if dataset == entry.evaluation.get("dataset"):
        raise ManifestError(f"{name} was evaluated (and trained) on {dataset}; pick another --dataset from "
                            f"{[d for d in DATASETS if d != dataset]}")
    protocol = _target_protocol(entries, dataset)
    size = list(image_size or protocol.get("image_size") or [])
    if len(size) != 2:
        raise ManifestError(f"no manifest entry gives {dataset}'s image size: pass --image-size H W")
    if dataset == "synthetic" and synthetic is None:
        synthetic = protocol.get("synthetic", {})
    architecture, _ = split_name(name)
    baseline_name = "avgpool_" + architecture.split("_", 1)[1]
    model = create_model(name, pretrained=True)
    baseline = create_model(baseline_name, pretrained_backbone=True)
    retrieval_set = _retrieval_set(dataset, split, synthetic, root)
    transform = eval_transform(size, mean=entry.mean, std=entry.std, interpolation=entry.interpolation)

    def recalls(net: Any) -> dict[str, float]:
        result = evaluate_retrieval(net, retrieval_set, transform, EvaluationOptions(ks=tuple(OFF_DOMAIN_KS)))
        return {f"R@{k}": round(100.0 * result.recalls[k], 2) for k in OFF_DOMAIN_KS}

    record: dict[str, Any] = {"dataset": dataset, "split": split, "image_size": size}
    if dataset == "synthetic":
        record["synthetic"] = {k: v for k, v in dict(synthetic or {}).items() if not k.startswith("_")}
    record.update(recalls=recalls(model), baseline=baseline_name, baseline_recalls=recalls(baseline),
                  command=command or f"python -m aggzoo.cli.manifest off-domain {name} --dataset {dataset}")
    kept = [r for r in entry.off_domain if (r["dataset"], r["split"]) != (dataset, split)]
    updated = replace(entry, off_domain=tuple(kept + [record]))
    ManifestEntry.from_json(updated.to_json(), f"{name} (new off_domain record)")  # the format's checks
    write_manifest([updated if e.name == name else e for e in entries], manifest)
    return record


def _metrics_arg(value: str) -> dict[str, float]:
    path = Path(value)
    data = json.loads(path.read_text()) if path.is_file() else json.loads(value)
    if not isinstance(data, dict) or not all(isinstance(v, (int, float)) for v in data.values()):
        raise argparse.ArgumentTypeError("--metrics takes a JSON object (or a file holding one) of name -> number")
    return {str(k): float(v) for k, v in data.items()}


def main(argv: Sequence[str] | None = None, prog: str = "python -m aggzoo.cli.manifest") -> int:
    """``aggzoo manifest add | verify | off-domain ...``: write or check the shipped weights' manifest; the exit status."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    add = sub.add_parser("add", help="write weights/<name>.safetensors from a checkpoint and update the manifest")
    add.add_argument("name", help="<architecture>.<tag>, e.g. netvlad_efficientnet_lite0.nordland_mini")
    add.add_argument("checkpoint", help="a Lightning checkpoint of aggzoo's pipeline (or any aggzoo state dict)")
    add.add_argument("--recipe", required=True, help="the command that trained it")
    add.add_argument("--metrics", required=True, type=_metrics_arg,
                     help='JSON object or file: {"nordland_mini/R@1": 5.3}')
    add.add_argument("--dataset", choices=DATASETS, help="where the metrics were measured")
    add.add_argument("--split", default="test")
    add.add_argument("--image-size", type=int, nargs=2, metavar=("H", "W"))
    add.add_argument("--synthetic-config", type=json.loads, default=None,
                     help="for --dataset synthetic: the SyntheticCityConfig fields as JSON (conf/synthetic)")
    add.add_argument("--tolerance", type=float, default=0.5, help="allowed |re-measured - recorded| in points")
    add.add_argument("--contents", choices=("delta", "full"), default="delta")
    add.add_argument("--notes")
    sub.add_parser("verify", help="re-hash and strictly load every manifest entry")
    off = sub.add_parser("off-domain", help="measure a shipped entry and its GAP baseline on another dataset "
                                            "and record both in its off_domain list")
    off.add_argument("name", help="a manifest entry, e.g. netvlad_efficientnet_lite0.synthetic")
    off.add_argument("--dataset", choices=DATASETS, required=True, help="a dataset the entry was not trained on")
    off.add_argument("--split", default="test")
    off.add_argument("--image-size", type=int, nargs=2, metavar=("H", "W"),
                     help="default: the image size of the entry evaluated in-domain on --dataset")
    off.add_argument("--synthetic-config", type=json.loads, default=None,
                     help="for --dataset synthetic: SyntheticCityConfig fields as JSON (default: that entry's)")
    off.add_argument("--root", help="the dataset folder (nordland_mini: its vg/ folder; default "
                                    "$AGGZOO_SHARED_DATA/nordland_mini/vg, else ../shared/data/nordland_mini/vg)")
    args = parser.parse_args(argv)
    with reported_user_errors():
        return _run(args, argv)


def _run(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    if args.command == "verify":
        for line in verify():
            print(line)
        return 0
    if args.command == "off-domain":
        record = measure_off_domain(
            args.name, args.dataset, split=args.split, image_size=args.image_size,
            synthetic=args.synthetic_config, root=args.root,
            command="python -m aggzoo.cli.manifest " + " ".join(sys.argv[1:] if argv is None else argv),
        )
        print(json.dumps(record, indent=2))
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
        command="python -m aggzoo.cli.manifest " + " ".join(sys.argv[1:] if argv is None else argv),
    )
    print(json.dumps(entry.to_json(), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
