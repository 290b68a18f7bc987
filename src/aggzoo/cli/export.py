"""Export a whole model (backbone + head) to ONNX, TorchScript or ``torch.export``, with a parity check.

    python -m aggzoo.cli.export <name> --format onnx|torchscript|export [--pretrained] [--output PATH] [--force]
        [--image-size H W] [--atol 1e-4]

``<name>`` is anything :func:`aggzoo.create_model` accepts (``netvlad_efficientnet_lite0.nordland_mini``,
``local-dir:<folder>``, ...). The exported file is loaded back (onnxruntime, ``torch.jit.load``,
``torch.export.load``) and its descriptors compared with the eager model's on random images of two
batch sizes (the batch axis is dynamic); a difference above ``--atol`` is an error.

Formats:
    onnx         ``torch.onnx.export`` (TorchScript-based exporter, opset 17), dynamic batch axis.
    torchscript  ``torch.jit.trace``: the control flow of this input size is frozen into the file.
    export       ``torch.export.export`` + ``torch.export.save`` (``.pt2``), dynamic batch axis.

Heads whose forward depends on data in Python (``.item()``, data-dependent shapes) cannot be
exported to every format; the error names the format and the exporter's reason.
"""

from __future__ import annotations

import argparse
import importlib
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from aggzoo.cli.reporting import reported_user_errors
from aggzoo.errors import ExportError
from aggzoo.hub.cfg import split_name
from aggzoo.hub.factory import create_model, is_model

__all__ = ["FORMATS", "ExportResult", "check_parity", "export_model", "load_exported", "main"]

FORMATS = ("onnx", "torchscript", "export")
_SUFFIX = {"onnx": ".onnx", "torchscript": ".pt", "export": ".pt2"}
_ONNX_OPSET = 17
#: what each format needs beyond torch: the exporter and the runtime of the parity check (the [export] extra)
_NEEDS = {"onnx": ("onnx", "onnxruntime")}




@dataclass(frozen=True)
class ExportResult:
    """An exported file: its path, its format, and the largest difference from the eager model's output."""

    path: Path
    format: str
    max_abs_diff: float
    seconds: float


def export_model(model: nn.Module, fmt: str, path: str | Path, example: Tensor) -> Path:
    """Write ``model`` (in eval mode) to ``path`` in format ``fmt``, traced on ``example [B, 3, H, W]``."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    model = model.eval()
    try:
        with torch.no_grad(), warnings.catch_warnings():
            # The exporters announce their own deprecations; the parity check is what matters here.
            warnings.simplefilter("ignore", (DeprecationWarning, FutureWarning, torch.jit.TracerWarning))
            if fmt == "onnx":
                torch.onnx.export(
                    model, (example,), str(path), dynamo=False, opset_version=_ONNX_OPSET,
                    input_names=["images"], output_names=["descriptors"],
                    dynamic_axes={"images": {0: "batch"}, "descriptors": {0: "batch"}},
                )
            elif fmt == "torchscript":
                torch.jit.trace(model, example, check_trace=False).save(str(path))
            else:
                batch = torch.export.Dim("batch", min=1, max=1024)
                program = torch.export.export(model, (example,), dynamic_shapes=({0: batch},))
                torch.export.save(program, str(path))
    except Exception as error:  # exporters raise many types; report one clear error
        raise ExportError(f"cannot export {type(model).__name__} to {fmt}: {type(error).__name__}: "
                          f"{str(error).splitlines()[0] if str(error) else ''}") from error
    return path


def load_exported(path: str | Path, fmt: str) -> Callable[[Tensor], Tensor]:
    """A callable ``images -> descriptors`` running the exported file."""
    path = Path(path)
    if fmt == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])

        def run(images: Tensor) -> Tensor:
            return torch.from_numpy(session.run(None, {"images": images.detach().cpu().numpy()})[0])

        return run
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        if fmt == "torchscript":
            return torch.jit.load(str(path), map_location="cpu")
        if fmt == "export":
            return torch.export.load(str(path)).module()
    raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")


def check_parity(model: nn.Module, exported: Callable[[Tensor], Tensor], inputs: Sequence[Tensor]) -> float:
    """Largest absolute descriptor difference between ``model`` and ``exported`` over ``inputs``."""
    worst = 0.0
    model = model.eval()
    with torch.no_grad():
        for images in inputs:
            expected = model(images)
            got = exported(images)
            if tuple(got.shape) != tuple(expected.shape):
                raise ExportError(f"exported model returned {tuple(got.shape)}, eager {tuple(expected.shape)}")
            worst = max(worst, (got.float() - expected.float()).abs().max().item())
    return worst


def export_and_check(
    model: nn.Module, fmt: str, path: str | Path, image_size: tuple[int, int], *, atol: float = 1e-4, seed: int = 0
) -> ExportResult:
    """Export, reload and compare on random images (batch 2 for tracing, then 2 and 3)."""
    generator = torch.Generator().manual_seed(seed)
    example = torch.randn(2, 3, *image_size, generator=generator)
    start = time.perf_counter()
    path = export_model(model, fmt, path, example)
    exported = load_exported(path, fmt)
    # A different batch size exercises the dynamic axis (TorchScript traces are shape-agnostic here
    # for the batch axis too, since no op of the models reads the batch size as a Python int).
    checks = [torch.randn(2, 3, *image_size, generator=generator), torch.randn(3, 3, *image_size, generator=generator)]
    diff = check_parity(model, exported, checks)
    if not diff <= atol:
        raise ExportError(f"{fmt} export of {type(model).__name__} differs from the eager model by {diff:.3g} > {atol}")
    return ExportResult(path=path, format=fmt, max_abs_diff=diff, seconds=time.perf_counter() - start)


def main(argv: Sequence[str] | None = None, prog: str = "python -m aggzoo.cli.export") -> int:
    """``aggzoo export <name> --format ...``: export a model and check it against the eager one; the exit status."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    parser.add_argument("name", help="a registered name (<head>_<backbone>[.<tag>]) or local-dir:<folder>")
    parser.add_argument("--format", choices=FORMATS, required=True)
    parser.add_argument("--pretrained", action="store_true", help="load the tag's weights first")
    parser.add_argument("--output", type=Path, help="output file (default: <name>.<format suffix>)")
    parser.add_argument("--force", action="store_true", help="overwrite the output file if it exists")
    parser.add_argument("--image-size", type=int, nargs=2, metavar=("H", "W"),
                        help="input size (default: the weights' input_size, else 224 224)")
    parser.add_argument("--atol", type=float, default=1e-4, help="largest allowed descriptor difference")
    args = parser.parse_args(argv)
    with reported_user_errors():
        return _export(args)


def _missing_packages(fmt: str) -> list[str]:
    """The packages ``fmt`` needs that cannot be imported here."""
    missing = []
    for package in _NEEDS.get(fmt, ()):
        try:
            importlib.import_module(package)
        except ImportError:
            missing.append(package)
    return missing


def _check_request(name: str, fmt: str, pretrained: bool) -> None:
    """Refuse, before any model is built, an export that cannot run or whose file would be misnamed."""
    if missing := _missing_packages(fmt):
        raise ExportError(f"--format {fmt} needs {' and '.join(_NEEDS[fmt])}, and {', '.join(missing)} is not "
                          'installed (the [cpu] install leaves them out): pip install -e ".[export]"')
    architecture, tag = split_name(name)
    if tag is not None and not pretrained and is_model(name):
        # create_model(name) without pretrained builds the architecture untrained; a file named after the
        # tag would then hold untrained weights under the name of trained ones.
        raise ExportError(f"{name} names the weights '{tag}', but --pretrained was not given, so the file would "
                          f"hold untrained weights under their name: add --pretrained to export those weights, or "
                          f"name the architecture alone ({architecture}) to export it untrained")


def _export(args: argparse.Namespace) -> int:
    _check_request(args.name, args.format, args.pretrained)
    stem = args.name.split(":", 1)[-1].rstrip("/").replace("/", "_")
    output = args.output or Path(Path(stem).name + _SUFFIX[args.format])
    if output.exists() and not args.force:  # checked before the model is built: nothing is overwritten silently
        raise ExportError(f"{output} exists; pass --force to overwrite it, or --output <another file>")
    model = create_model(args.name, pretrained=args.pretrained).eval()
    cfg = getattr(model, "pretrained_cfg", None)
    size = tuple(args.image_size) if args.image_size else (tuple(cfg.input_size[1:]) if cfg is not None else (224, 224))
    result = export_and_check(model, args.format, output, size, atol=args.atol)
    print(f"{result.path}: {result.format}, input [B, 3, {size[0]}, {size[1]}] -> [B, {model.out_dim}], "
          f"max |exported - eager| = {result.max_abs_diff:.3g} (<= {args.atol}), {result.seconds:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
