"""Loading and saving weights, safely: files, the download cache, local folders, the Hugging Face Hub.

Safe by construction:

- Nothing is unpickled with code execution. ``.safetensors`` files hold only tensors; anything else
  is read with ``torch.load(..., weights_only=True)``, whose unpickler refuses every global outside
  torch's tensor types (plus the numpy scalar types some training scripts store), so a pickle whose
  ``__reduce__`` would run code is rejected before anything runs (:class:`UnsafeCheckpointError`).
- A file whose sha256 differs from the pinned digest is refused before it is parsed
  (:class:`ChecksumMismatchError`).
- Loading is strict: missing, unexpected and wrongly shaped keys are reported by name
  (:class:`StateDictMismatchError`); a foreign checkpoint goes through a *named* remapping
  function (``aggzoo.convert.*``) and is then loaded just as strictly.

Where files live:

- ``weights/`` (or ``$AGGZOO_WEIGHTS_DIR``): weights shipped with aggzoo, listed in
  ``weights/manifest.json``; the package reaches it as ``aggzoo/weights`` (a link in a checkout, a
  copy inside an installed wheel).
- ``$AGGZOO_CACHE`` (default ``$XDG_CACHE_HOME/aggzoo`` or ``~/.cache/aggzoo``): downloads, one
  folder per model name. On an offline machine (or with ``AGGZOO_OFFLINE=1``) nothing is
  downloaded; the error names the URL and the exact path to place the file at.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from aggzoo.convert.common import ConversionError, unwrap_checkpoint
from aggzoo.pretrained import PretrainedCfg

__all__ = [
    "CONFIG_FILE",
    "WEIGHTS_FILE",
    "CheckpointError",
    "ChecksumMismatchError",
    "LoadReport",
    "StateDictMismatchError",
    "UnsafeCheckpointError",
    "WeightsUnavailableError",
    "cache_dir",
    "download",
    "fetch_weights",
    "load_checkpoint",
    "load_head",
    "load_into",
    "load_pretrained",
    "read_local_dir",
    "read_spec",
    "read_state_dict",
    "save_pretrained",
    "sha256_of",
    "weights_dir",
]

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
_CONFIG_FORMAT = "aggzoo.save_pretrained/1"
#: Where a checkpoint of the training pipeline keeps the backbone + head config that rebuilds its
#: model (``aggzoo.pipeline.MODEL_CONFIG_KEY``), and where save_pretrained's safetensors metadata does.
SPEC_KEY = "aggzoo_model_config"
_OFFLINE_ENV = ("AGGZOO_OFFLINE", "HF_HUB_OFFLINE")
_DOWNLOAD_TIMEOUT_S = 60.0


class CheckpointError(RuntimeError):
    """A weights file cannot be used."""


class ChecksumMismatchError(CheckpointError):
    """The file's sha256 differs from the pinned one: refused before parsing."""


class UnsafeCheckpointError(CheckpointError):
    """The file would need to run code to load (a pickle naming non-tensor globals)."""


class StateDictMismatchError(CheckpointError):
    """Keys or shapes of a checkpoint do not match the model."""


class WeightsUnavailableError(FileNotFoundError):
    """The weights are neither shipped, cached, nor downloadable from here."""


# ---------------------------------------------------------------------------------------------
# Locations


def weights_dir() -> Path:
    """The folder of shipped weights: ``$AGGZOO_WEIGHTS_DIR``, else the package's ``weights``: in a
    checkout a link to the repository's ``weights/``, in an installed wheel a copy of it."""
    env = os.environ.get("AGGZOO_WEIGHTS_DIR")
    if env:
        return Path(env)
    return Path(__file__).parent / "weights"


def cache_dir() -> Path:
    """The download cache: ``$AGGZOO_CACHE``, else ``$XDG_CACHE_HOME/aggzoo``, else ``~/.cache/aggzoo``."""
    env = os.environ.get("AGGZOO_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "aggzoo"


def _offline() -> bool:
    return any(os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on") for name in _OFFLINE_ENV)


# ---------------------------------------------------------------------------------------------
# Reading files safely


def sha256_of(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _check_sha256(path: Path, expected: str | None) -> None:
    """Refuse ``path`` unless its sha256 is ``expected`` (nothing is read when nothing is pinned)."""
    if expected is None:
        return
    actual = sha256_of(path)
    if actual != expected:
        raise ChecksumMismatchError(
            f"{path} has sha256 {actual}, expected {expected}. The file is corrupt, truncated or not the "
            "published one; it was not loaded. Delete it and fetch it again."
        )


def _is_safetensors(path: Path) -> bool:
    # A safetensors file is an 8-byte little-endian header length followed by a JSON header.
    with path.open("rb") as file:
        head = file.read(9)
    return len(head) == 9 and head[8:9] == b"{"


def _numpy_scalar_globals() -> list[Any]:
    """numpy's scalar reconstructors: training scripts store metrics (``best_r5``) as numpy
    floats next to the weights. They rebuild a number from a dtype and raw bytes; nothing else."""
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is a dependency
        return []
    found: list[Any] = [np.dtype]
    for module_name in ("numpy._core.multiarray", "numpy.core.multiarray"):
        try:
            module = __import__(module_name, fromlist=["scalar"])
        except ImportError:
            continue
        found.append(module.scalar)
    found.extend(type(np.dtype(code)) for code in "?bhilqBHILQefdgFDG")
    return found


def _torch_load_weights_only(path: Path) -> Any:
    try:
        with torch.serialization.safe_globals(_numpy_scalar_globals()):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise UnsafeCheckpointError(
            f"{path} was refused: loading it would need to import or call code outside torch's tensor "
            f"types ({str(error).splitlines()[0][:300]}...). aggzoo only reads tensors "
            "(torch.load(weights_only=True) or safetensors) and never runs code from a checkpoint. If "
            "you trust the file, re-save its state dict with torch.save(state_dict) or safetensors."
        ) from None
    except (RuntimeError, EOFError, ValueError) as error:
        raise CheckpointError(f"{path} is not a readable PyTorch or safetensors checkpoint: {error}") from None


def read_state_dict(path: str | os.PathLike, *, sha256: str | None = None) -> dict[str, Tensor]:
    """The state dict in a checkpoint file, read without running any code from it.

    The sha256 is checked first (when given). Safetensors files are recognised by content;
    everything else goes through ``torch.load(weights_only=True)``. Containers (Lightning
    ``{"state_dict"}``, ``{"model_state_dict"}``) and ``module.`` prefixes are unwrapped
    (:func:`aggzoo.convert.common.unwrap_checkpoint`).
    """
    path = Path(path)
    if not path.is_file():
        raise WeightsUnavailableError(f"checkpoint file not found: {path}")
    _check_sha256(path, sha256)
    if _is_safetensors(path):
        from safetensors.torch import load_file

        try:
            obj: Any = load_file(str(path), device="cpu")
        except Exception as error:  # safetensors raises its own error types
            raise CheckpointError(f"{path} is not a valid safetensors file: {error}") from None
    else:
        obj = _torch_load_weights_only(path)
    try:
        return unwrap_checkpoint(obj)
    except ConversionError as error:
        raise CheckpointError(f"{path}: {error}") from None


# ---------------------------------------------------------------------------------------------
# Downloading into the cache


def download(url: str, destination: Path, *, sha256: str | None, name: str) -> Path:
    """Download ``url`` to ``destination`` (atomically), checking ``sha256`` before the file is kept."""
    if _offline():
        raise WeightsUnavailableError(_offline_message(name, url, destination, sha256, "offline mode is set"))
    destination.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp_name = tempfile.mkstemp(dir=destination.parent, prefix=destination.name + ".", suffix=".part")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(handle, "wb") as out, urllib.request.urlopen(url, timeout=_DOWNLOAD_TIMEOUT_S) as response:
            shutil.copyfileobj(response, out)
        _check_sha256(tmp, sha256)
        os.replace(tmp, destination)
    except (urllib.error.URLError, OSError) as error:
        tmp.unlink(missing_ok=True)
        if isinstance(error, WeightsUnavailableError):
            raise
        raise WeightsUnavailableError(_offline_message(name, url, destination, sha256, str(error))) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return destination


def _offline_message(name: str, url: str, destination: Path, sha256: str | None, reason: str) -> str:
    pin = f" (sha256 {sha256})" if sha256 else ""
    return (
        f"weights for {name} are not available here and could not be downloaded ({reason}).\n"
        f"  Download:  {url}\n"
        f"  Place at:  {destination}{pin}\n"
        "Then call again (the cache folder can be moved with AGGZOO_CACHE)."
    )


def _url_filename(url: str) -> str:
    return Path(urllib.parse.unquote(urllib.parse.urlparse(url).path)).name or "weights.bin"


def fetch_weights(cfg: PretrainedCfg) -> Path:
    """A local path holding the weights of ``cfg``: the shipped file, the cached download, or a
    fresh download (Hugging Face Hub first, then the URL). The sha256 is checked on every use."""
    if cfg.file is not None:
        path = weights_dir() / cfg.file
        if not path.is_file():
            raise WeightsUnavailableError(
                f"{cfg.name} ships as {cfg.file} in the weights folder, but {path} does not exist. In a "
                "checkout, restore it with `git checkout -- weights/`; elsewhere set AGGZOO_WEIGHTS_DIR to "
                "a folder holding it."
            )
        _check_sha256(path, cfg.sha256)
        return path
    folder = cache_dir() / cfg.name
    # (url, file name in the cache); one cache folder per model name, so names never collide.
    sources = [(url, cfg.filename or filename or _url_filename(url))
               for url, filename in ((cfg.hf_url, cfg.hf_hub_filename), (cfg.url, None)) if url is not None]
    manual = cfg.filename or (sources[0][1] if sources else None)
    candidates = [name for _, name in sources] + ([manual] if cfg.download_page and manual else [])
    for filename in dict.fromkeys(candidates):
        cached = folder / filename
        if cached.is_file():
            _check_sha256(cached, cfg.sha256)
            _warn_unpinned(cfg, cached)
            return cached
    if not sources and cfg.download_page is None:
        raise WeightsUnavailableError(f"{cfg.name} has no weights source (file, url, hf_hub_id or download_page)")
    errors: list[str] = []
    for url, filename in sources:
        try:
            path = download(url, folder / filename, sha256=cfg.sha256, name=cfg.name)
        except WeightsUnavailableError as error:
            errors.append(str(error))
            continue
        _warn_unpinned(cfg, path)
        return path
    if cfg.download_page is not None:
        pin = f" (sha256 {cfg.sha256})" if cfg.sha256 else ""
        errors.append(
            f"weights for {cfg.name} cannot be downloaded by a program.\n"
            f"  Download:  {cfg.download_page}\n"
            f"  Place at:  {folder / manual}{pin}\n"
            "Then call again (the cache folder can be moved with AGGZOO_CACHE)."
        )
    raise WeightsUnavailableError("\n".join(errors))


def _warn_unpinned(cfg: PretrainedCfg, path: Path) -> None:
    if cfg.sha256 is None:
        warnings.warn(
            f"{cfg.name}: no sha256 is pinned for {path.name}; this copy has sha256 {sha256_of(path)}. "
            "Compare it with a trusted copy (and pin it in the registry).",
            stacklevel=3,
        )


# ---------------------------------------------------------------------------------------------
# Putting a state dict into a model


@dataclass
class LoadReport:
    """What a load did. ``kept`` lists model keys the file did not hold and that kept their value
    on purpose (``contents="delta"``: the pretrained backbone's tensors; ``num_batches_tracked``
    counters older checkpoints lack)."""

    loaded: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    mismatched: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched)

    def describe(self, limit: int = 20) -> str:
        def show(items: list[Any]) -> str:
            text = ", ".join(str(i) for i in items[:limit])
            return text + (f", ... ({len(items) - limit} more)" if len(items) > limit else "")

        parts = []
        if self.missing:
            parts.append(f"missing keys (in the model, not in the checkpoint): {show(self.missing)}")
        if self.unexpected:
            parts.append(f"unexpected keys (in the checkpoint, not in the model): {show(self.unexpected)}")
        if self.mismatched:
            rows = [f"{k} checkpoint {tuple(a)} vs model {tuple(b)}" for k, a, b in self.mismatched]
            parts.append(f"shape mismatches: {show(rows)}")
        return "; ".join(parts) if parts else f"all {len(self.loaded)} tensors loaded"


_COUNTER = "num_batches_tracked"


def load_into(
    model: nn.Module,
    state: Mapping[str, Tensor],
    *,
    strict: bool = True,
    keep_missing_under: tuple[str, ...] = (),
    what: str = "checkpoint",
) -> LoadReport:
    """Copy ``state`` into ``model``, reporting keys by name.

    Args:
        strict: raise :class:`StateDictMismatchError` on any missing, unexpected or mismatched key.
        keep_missing_under: key prefixes whose absence from ``state`` is expected (they keep the
            model's current values, e.g. ``("backbone.",)`` for a delta checkpoint).
        what: the checkpoint's name for messages.
    """
    own = model.state_dict()
    report = LoadReport()
    to_load: dict[str, Tensor] = {}
    for key, tensor in state.items():
        if key not in own:
            report.unexpected.append(key)
        elif tuple(own[key].shape) != tuple(tensor.shape):
            report.mismatched.append((key, tuple(tensor.shape), tuple(own[key].shape)))
        else:
            to_load[key] = tensor
    for key in own:
        if key in state:
            continue
        if key.endswith(_COUNTER) or key.startswith(keep_missing_under):
            report.kept.append(key)
        else:
            report.missing.append(key)
    if strict and not report.ok:
        raise StateDictMismatchError(f"cannot load {what} into {type(model).__name__}: {report.describe()}")
    with torch.no_grad():
        for key, tensor in to_load.items():
            own[key].copy_(tensor)
    report.loaded = list(to_load)
    return report


def load_checkpoint(
    model: nn.Module,
    path: str | os.PathLike,
    *,
    sha256: str | None = None,
    remap: Any = None,
    contents: str = "full",
    strict: bool = True,
) -> LoadReport:
    """Read a checkpoint file safely, remap its keys (a named function from ``aggzoo.convert``, or
    ``None`` for aggzoo's own names) and load it strictly into ``model``."""
    state = read_state_dict(path, sha256=sha256)
    if remap is not None:
        try:
            state = remap(state, model)
        except ConversionError as error:
            raise StateDictMismatchError(f"{path}: {error}") from None
    keep = ("backbone.",) if contents == "delta" else ()
    return load_into(model, state, strict=strict, keep_missing_under=keep, what=str(path))


def load_pretrained(model: nn.Module, cfg: PretrainedCfg, *, strict: bool = True) -> LoadReport:
    """Fetch the weights of ``cfg`` (shipped file, cache or download) and load them into ``model``."""
    path = fetch_weights(cfg)
    return load_checkpoint(model, path, sha256=cfg.sha256, remap=cfg.remap, contents=cfg.contents, strict=strict)


# ---------------------------------------------------------------------------------------------
# save_pretrained / local folders


def save_pretrained(
    model: nn.Module,
    directory: str | os.PathLike,
    *,
    spec: Mapping[str, Any] | None = None,
    pretrained_cfg: PretrainedCfg | None = None,
) -> Path:
    """Write ``model`` as ``<directory>/model.safetensors`` plus ``config.json``, readable back with
    ``aggzoo.create_model("local-dir:<directory>")``.

    Args:
        model: a :class:`~aggzoo.models.VPRModel`.
        spec: how to rebuild it -- ``{"backbone": {"_target_": ..., <kwargs>}, "head": {"_target_":
            ..., <kwargs>}}``, the same shape as the Hydra ``conf/backbone`` and ``conf/head`` files.
            Defaults to the spec ``create_model`` recorded on the model (``model.aggzoo_spec``).
        pretrained_cfg: preprocessing and provenance to record (defaults to ``model.pretrained_cfg``).

    All tensors are saved (the backbone's ``pretrained`` flag is cleared in the saved spec: the
    weights come from the file).
    """
    from aggzoo.registry import normalise_spec

    spec = spec if spec is not None else getattr(model, "aggzoo_spec", None)
    if spec is None:
        raise ValueError(
            "save_pretrained needs to know how to rebuild this model: it was not built by "
            "aggzoo.create_model, so pass spec={'backbone': {...}, 'head': {...}} (the contents of the "
            "Hydra conf/backbone and conf/head entries it was built from)."
        )
    spec = normalise_spec(spec)
    spec["backbone"]["pretrained"] = False
    cfg = pretrained_cfg if pretrained_cfg is not None else getattr(model, "pretrained_cfg", None)
    out_dim = getattr(model, "out_dim", None)
    config: dict[str, Any] = {
        "format": _CONFIG_FORMAT,
        "architecture": getattr(model, "aggzoo_architecture", None),
        "spec": spec,
        "out_dim": out_dim,
        "pretrained_cfg": _cfg_for_json(cfg) if cfg is not None else None,
    }
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    from safetensors.torch import save_file

    # Clones: safetensors refuses tensors that share storage, and a state dict may hold views.
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in model.state_dict().items()}
    save_file(tensors, str(directory / WEIGHTS_FILE), metadata={"format": _CONFIG_FORMAT, SPEC_KEY: json.dumps(spec)})
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return directory


def _cfg_for_json(cfg: PretrainedCfg) -> dict[str, Any]:
    data = cfg.to_dict()
    # The saved folder is its own weight source: do not point readers back at the original file.
    for key in ("file", "url", "hf_hub_id", "hf_hub_filename", "sha256", "remap", "contents"):
        data.pop(key, None)
    return data


def read_local_dir(directory: str | os.PathLike) -> tuple[dict[str, Any], Path]:
    """``(config, weights path)`` of a folder written by :func:`save_pretrained`."""
    directory = Path(directory)
    config_path, weights_path = directory / CONFIG_FILE, directory / WEIGHTS_FILE
    for needed in (config_path, weights_path):
        if not needed.is_file():
            raise WeightsUnavailableError(
                f"{directory} is not a folder written by aggzoo.save_pretrained: {needed.name} is missing "
                f"(expected {CONFIG_FILE} and {WEIGHTS_FILE})"
            )
    config = json.loads(config_path.read_text())
    if config.get("format") != _CONFIG_FORMAT:
        raise CheckpointError(f"{config_path}: unknown format {config.get('format')!r}, expected {_CONFIG_FORMAT!r}")
    return config, weights_path


def read_spec(path: str | os.PathLike) -> dict[str, Any]:
    """The model spec stored in a checkpoint file: a training checkpoint of aggzoo's pipeline
    (``checkpoint["aggzoo_model_config"]``) or a safetensors file written by :func:`save_pretrained`
    (its metadata). Read without running code."""
    path = Path(path)
    if not path.is_file():
        raise WeightsUnavailableError(f"checkpoint file not found: {path}")
    if _is_safetensors(path):
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as file:
            metadata = file.metadata() or {}
        text = metadata.get(SPEC_KEY)
        spec = json.loads(text) if text else None
    else:
        obj = _torch_load_weights_only(path)
        spec = obj.get(SPEC_KEY) if isinstance(obj, Mapping) else None
    if not isinstance(spec, Mapping):
        raise CheckpointError(
            f"{path} does not say which model it holds (no {SPEC_KEY!r}); name the architecture instead: "
            "aggzoo.create_model('<head>_<backbone>', checkpoint_path=...)"
        )
    return dict(spec)


# ---------------------------------------------------------------------------------------------
# load_head


def load_head(name: str, backbone: nn.Module, *, pretrained: bool = True, **head_overrides: Any) -> nn.Module:
    """A registered model's head, with its pretrained weights, on another (compatible) backbone.

    Args:
        name: ``<architecture>[.<tag>]`` (``gem_efficientnet_lite0.nordland_mini``).
        backbone: any module returning ``Features`` and exposing ``feature_info`` (a
            :class:`~aggzoo.models.backbones.TimmBackbone`). Its channels must be those the head
            was trained on.
        pretrained: load the head's weights (else a freshly initialised head of that architecture).

    Returns:
        ``VPRModel(backbone, head)``.

    Raises:
        ValueError: when the backbone's channels differ from what the head expects.
    """
    from aggzoo.models.vpr_model import VPRModel
    from aggzoo.registry import build_head_for, resolve

    architecture, cfg, kwargs = resolve(name, pretrained=pretrained, overrides=head_overrides)
    head, reference = build_head_for(architecture, kwargs, backbone)
    model = VPRModel(backbone, head)
    if cfg is None:
        return model
    path = fetch_weights(cfg)
    state = read_state_dict(path, sha256=cfg.sha256)
    if cfg.remap is not None:
        state = cfg.remap(state, reference)
    head_state = {k[len("head."):]: v for k, v in state.items() if k.startswith("head.")}
    if not head_state:
        raise StateDictMismatchError(f"{cfg.name}: the checkpoint holds no head.* tensors")
    load_into(head, head_state, what=f"{cfg.name} (head)")
    model.pretrained_cfg = cfg
    return model
