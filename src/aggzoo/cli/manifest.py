"""``python -m aggzoo.cli.manifest add | verify``: write and check the entries of ``weights/manifest.json``.

Regenerating a file (after ``python train.py ...`` wrote a Lightning checkpoint)::

    python -m aggzoo.cli.manifest add <name> <checkpoint.ckpt> --recipe "python train.py ..." \\
        --metrics results.json [--dataset nordland_mini --image-size 112 224] [--contents delta]

``add`` rebuilds the architecture, loads the checkpoint strictly, writes the safetensors file
(only the tensors that differ from the pretrained backbone with ``--contents delta``), hashes it,
evaluates nothing itself (the metrics come from the training run's results file) and updates the
entry in place. ``verify`` re-hashes and strictly loads every entry. The format is
:mod:`aggzoo.hub.manifest`.
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
from safetensors.torch import save_file

from aggzoo.cli.reporting import reported_user_errors
from aggzoo.errors import ManifestError
from aggzoo.hub.cfg import split_name
from aggzoo.hub.factory import create_model
from aggzoo.hub.io import load_checkpoint, read_checkpoint, sha256_of, weights_dir
from aggzoo.hub.manifest import DATASETS, MANIFEST_FILE, ManifestEntry, read_manifest, write_manifest

__all__ = ["add_entry", "main", "verify"]


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
    trained = read_checkpoint(checkpoint).spec
    if trained is None:
        return  # a bare state dict: strict loading is the only check available
    registered = dict(model.aggzoo_spec, backbone=dict(model.aggzoo_spec["backbone"]))
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


def main(argv: Sequence[str] | None = None, prog: str = "python -m aggzoo.cli.manifest") -> int:
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
    args = parser.parse_args(argv)
    with reported_user_errors():
        return _run(args, argv)


def _run(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
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
        command="python -m aggzoo.cli.manifest " + " ".join(sys.argv[1:] if argv is None else argv),
    )
    print(json.dumps(entry.to_json(), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
