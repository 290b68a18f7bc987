"""Safe file IO of :mod:`aggzoo.hub`: the one checkpoint reader, the download cache, saved folders.

Safe by construction:

- Nothing is unpickled with code execution. ``.safetensors`` files hold only tensors; anything else
  is read with ``torch.load(..., weights_only=True)``, whose unpickler refuses every global outside
  torch's tensor types (plus the numpy scalar types some training scripts store), so a pickle whose
  ``__reduce__`` would run code is rejected before anything runs (:class:`UnsafeCheckpointError`).
- A file whose sha256 differs from the pinned digest is refused before it is parsed
  (:class:`ChecksumMismatchError`).
- Loading is strict: missing, unexpected and wrongly shaped keys are reported by name
  (:class:`StateDictMismatchError`); a foreign checkpoint goes through a *named* remapping
  function (declared in the method's ``aggzoo.zoo`` file) and is then loaded just as strictly.
- The model a file describes (a training checkpoint's or a saved folder's spec) is validated by
  :func:`aggzoo.hub.builder.normalise_spec` as it is read: a spec naming anything but aggzoo's own
  model classes is refused here, before any model is built.

Where files live:

- ``weights/`` (or ``$AGGZOO_WEIGHTS_DIR``): weights shipped with aggzoo, listed in
  ``weights/manifest.json``; the package reaches it as ``aggzoo/weights`` (a link in a checkout, a
  copy inside an installed wheel).
- ``$AGGZOO_CACHE`` (default ``$XDG_CACHE_HOME/aggzoo`` or ``~/.cache/aggzoo``): plain-URL downloads, one
  folder per model name, and the place for a file copied by hand.
- The Hugging Face cache (``HF_HUB_CACHE``, default ``~/.cache/huggingface/hub``): Hugging Face
  sources, shared with every other tool that uses ``huggingface_hub``.

On an offline machine (or with ``AGGZOO_OFFLINE=1`` / ``HF_HUB_OFFLINE=1``) nothing is downloaded
(the Hugging Face cache is still read); the error names the URL and the exact path to place the file at.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import struct
import urllib.error
import urllib.parse
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from huggingface_hub import hf_hub_download, hf_hub_url
from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, HFValidationError
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from aggzoo.errors import (
    CheckpointError,
    ChecksumMismatchError,
    ConfigError,
    ConversionError,
    StateDictMismatchError,
    UnsafeCheckpointError,
    WeightsUnavailableError,
)
from aggzoo.hub.builder import normalise_spec
from aggzoo.hub.card import CARD_FILE, model_card, read_results_file
from aggzoo.hub.cfg import PretrainedCfg
from aggzoo.hub.remap import show_keys, strip_prefix

__all__ = [
    "CONFIG_FILE",
    "ENSEMBLING_KEY",
    "SPEC_KEY",
    "WEIGHTS_FILE",
    "CheckpointFile",
    "LoadReport",
    "cache_dir",
    "download",
    "ensembled_state",
    "fetch_weights",
    "hf_hub_folder",
    "is_ensembling_alpha",
    "load_checkpoint",
    "load_into",
    "load_pretrained",
    "read_checkpoint",
    "read_local_dir",
    "save_pretrained",
    "save_weights",
    "sha256_of",
    "unwrap_checkpoint",
    "weights_dir",
]

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
_CONFIG_FORMAT = "aggzoo.save_pretrained/1"
#: Where a checkpoint of the training pipeline keeps the backbone + head spec that rebuilds its
#: model, and where save_pretrained's safetensors metadata does.
SPEC_KEY = "aggzoo_model_config"
#: Where a training checkpoint keeps the weights its fine-tuning started from and the WiSE-FT
#: coefficient (:class:`aggzoo.training.weight_ensembling.WeightEnsembling`): ``{"alpha": float,
#: "start": {model key: tensor}}``. Every reader that builds a model from the file applies it.
ENSEMBLING_KEY = "aggzoo_weight_ensembling"
_OFFLINE_ENV = ("AGGZOO_OFFLINE", "HF_HUB_OFFLINE")


# -- Locations -------------------------------------------------------------------------------------


def weights_dir() -> Path:
    """The folder of shipped weights: ``$AGGZOO_WEIGHTS_DIR``, else the package's ``weights``: in a
    checkout a link to the repository's ``weights/``, in an installed wheel a copy of it."""
    env = os.environ.get("AGGZOO_WEIGHTS_DIR")
    if env:
        return Path(env)
    return Path(__file__).parent.parent / "weights"


def cache_dir() -> Path:
    """The download cache: ``$AGGZOO_CACHE``, else ``$XDG_CACHE_HOME/aggzoo``, else ``~/.cache/aggzoo``."""
    env = os.environ.get("AGGZOO_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "aggzoo"


def _offline() -> bool:
    return any(os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on") for name in _OFFLINE_ENV)


# -- Reading files safely --------------------------------------------------------------------------


def sha256_of(path: str | os.PathLike) -> str:
    """The hex sha256 of a file, read in 1 MiB chunks."""
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
        if not (_names_a_global(str(error)) or _is_raw_pickle(path)):
            # Not a refusal of code: the bytes are not a pickle torch can read (random data, another format).
            raise _corrupt(path, error) from None
        raise UnsafeCheckpointError(
            f"{path} was refused: loading it would need to import or call code outside torch's tensor "
            f"types ({_unsafe_reason(str(error))}). aggzoo only reads tensors (torch.load(weights_only=True) "
            "or safetensors) and never runs code from a checkpoint. If you trust the file, re-save its "
            "state dict with torch.save(state_dict) or safetensors."
        ) from None
    except Exception as error:  # noqa: BLE001 - garbage bytes fail the unpickler in any way (KeyError, ...)
        raise _corrupt(path, error) from None


def _names_a_global(message: str) -> bool:
    """Whether torch's weights-only unpickler refused a named global (code), not unreadable bytes."""
    return "GLOBAL" in message or "global" in message.split("WeightsUnpickler error:", 1)[-1].lower()


def _is_raw_pickle(path: Path) -> bool:
    """A plain ``pickle.dump`` file (PROTO opcode, protocol 2-5): one the safe unpickler stopped on is
    refused as unsafe, not reported as corrupt (protocol 4+ framing is beyond the safe unpickler)."""
    with path.open("rb") as file:
        head = file.read(2)
    return len(head) == 2 and head[0] == 0x80 and 2 <= head[1] <= 5


def _corrupt(path: Path, error: BaseException) -> CheckpointError:
    """A file that is truncated, corrupt or not a checkpoint, with torch's reason in one short clause
    (never torch's advice to retry with ``weights_only=False``)."""
    if path.stat().st_size == 0:
        reason = "the file is empty"
    else:
        text = str(error)
        if "WeightsUnpickler error:" in text:  # keep the unpickler's own words, drop torch's preamble
            text = text.split("WeightsUnpickler error:", 1)[1]
        lines = [line.strip() for line in text.splitlines() if line.strip() and "weights_only" not in line]
        reason = lines[0].split(". ")[0].rstrip(".")[:200] if lines else ""
        reason = f"{type(error).__name__}: {reason}" if reason and isinstance(error, (KeyError, IndexError)) else (
            reason or type(error).__name__)
    return CheckpointError(f"{path} is truncated, corrupt or not a checkpoint ({reason}); fetch or copy it again")


def _unsafe_reason(message: str) -> str:
    """The global torch refused, without torch's advice to retry with ``weights_only=False``
    (the one thing never to do with a file that asks for code)."""
    for line in message.splitlines():
        if "GLOBAL" in line or "Unsupported global" in line:
            return line.strip().rstrip(".")[:300]
    return "a pickled object that is not a tensor"


# Containers that training scripts wrap a state dict in, most specific first: Lightning saves
# {"state_dict": ...}; the deep-visual-geo-localization-benchmark family (ImAge, EDTformer,
# CricaVPR) saves {"model_state_dict": ...}; several others save {"model": ...}.
_CONTAINER_KEYS = ("state_dict", "model_state_dict", "model")
_DATA_PARALLEL = "module."
# A LightningModule of our own pipeline holds the VPRModel as ``self.model``.
_LIGHTNING_MODEL = "model."
_OUR_ROOTS = ("backbone.", "head.")


def _is_state_dict(obj: object) -> bool:
    return isinstance(obj, Mapping) and bool(obj) and all(isinstance(v, Tensor) for v in obj.values())


def unwrap_checkpoint(obj: object) -> dict[str, Tensor]:
    """The state dict inside whatever a training script saved.

    Accepts a raw state dict, Lightning's ``{"state_dict": ...}``, ``{"model_state_dict": ...}``
    and ``{"model": ...}``; removes the ``module.`` prefix ``nn.DataParallel`` adds; and, for a
    checkpoint of aggzoo's own Lightning module (keys ``model.backbone.*`` / ``model.head.*``),
    keeps the model's keys without the ``model.`` prefix (loss or metric state is dropped).
    """
    found = obj
    if not _is_state_dict(found):
        if not isinstance(found, Mapping):
            raise ConversionError(f"expected a state dict (a mapping of names to tensors), got {type(found).__name__}")
        for key in _CONTAINER_KEYS:
            if key in found and _is_state_dict(found[key]):
                found = found[key]
                break
        else:
            raise ConversionError(
                "expected a state dict, or a dict holding one under one of "
                f"{list(_CONTAINER_KEYS)}; this checkpoint's top-level keys are {show_keys(map(str, found))}"
            )
    state = dict(found)
    if all(k.startswith(_DATA_PARALLEL) for k in state):
        state = strip_prefix(state, _DATA_PARALLEL)
    if any(k.startswith(_LIGHTNING_MODEL + root) for k in state for root in _OUR_ROOTS):
        state = {k[len(_LIGHTNING_MODEL):]: v for k, v in state.items() if k.startswith(_LIGHTNING_MODEL)}
    return state


def is_ensembling_alpha(value: Any) -> bool:
    """Whether ``value`` is a weight-ensembling coefficient: a number (not a bool) in ``[0, 1]``."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0.0 <= float(value) <= 1.0


def ensembled_state(state: Mapping[str, Tensor], record: Any, *, where: str = "checkpoint") -> dict[str, Tensor]:
    """WiSE-FT weight-space ensembling (Wortsman et al., CVPR 2022): ``(1 - alpha) * start + alpha *
    state`` for every floating-point tensor of ``record["start"]``, the weights fine-tuning started from.

    Tensors the record does not hold, and integer ones (BatchNorm's ``num_batches_tracked``), stay as
    trained. ``alpha = 1`` is ``state``; ``alpha = 0`` is the start.

    Raises:
        CheckpointError: the record is not ``{"alpha": float in [0, 1], "start": {key: tensor}}``, or
            names a key the state lacks or a tensor of another shape.
    """
    if not isinstance(record, Mapping) or set(record) != {"alpha", "start"}:
        raise CheckpointError(f"{where}: its {ENSEMBLING_KEY!r} record must hold exactly 'alpha' and 'start'")
    alpha, start = record["alpha"], record["start"]
    if not is_ensembling_alpha(alpha):
        raise CheckpointError(f"{where}: weight-ensembling alpha must be a number in [0, 1], got {alpha!r}")
    if not _is_state_dict(start):
        raise CheckpointError(f"{where}: its weight-ensembling 'start' must map parameter names to tensors")
    unknown = sorted(set(start) - set(state))
    if unknown:
        raise CheckpointError(f"{where}: weight-ensembling 'start' names keys the model lacks: {show_keys(unknown)}")
    out = dict(state)
    for key, begin in start.items():
        end = state[key]
        if begin.shape != end.shape:
            raise CheckpointError(f"{where}: weight-ensembling 'start' holds {key} of shape {tuple(begin.shape)}, "
                                  f"the model {tuple(end.shape)}")
        if end.is_floating_point():
            out[key] = torch.lerp(begin.to(end.dtype), end, float(alpha))
    return out


@dataclass(frozen=True)
class CheckpointFile:
    """What :func:`read_checkpoint` found in a file.

    Attributes:
        path: the file.
        contents: the object as stored: the top-level mapping of a ``torch.save`` file (a
            Lightning checkpoint: ``state_dict``, ``epoch``, callback states...), the tensors of a
            safetensors file.
        spec: the model spec the file records (a training checkpoint's ``aggzoo_model_config``, a
            saved folder's safetensors metadata), already validated by
            :func:`~aggzoo.hub.builder.normalise_spec`; ``None`` when it records none.
    """

    path: Path
    contents: Any
    spec: dict[str, Any] | None

    @property
    def _ensembling_record(self) -> Any:
        """The file's :data:`ENSEMBLING_KEY` record as stored (``None`` when it has none)."""
        return self.contents.get(ENSEMBLING_KEY) if isinstance(self.contents, Mapping) else None

    @property
    def ensembling_alpha(self) -> float | None:
        """The WiSE-FT coefficient the file records (:data:`ENSEMBLING_KEY`), ``None`` when it records none."""
        record = self._ensembling_record
        return float(record["alpha"]) if isinstance(record, Mapping) and "alpha" in record else None

    def state_dict(self, *, ensembled: bool = True) -> dict[str, Tensor]:
        """The model's state dict, unwrapped (:func:`unwrap_checkpoint`); for a checkpoint that records
        weight ensembling (:data:`ENSEMBLING_KEY`), the ensembled weights unless ``ensembled=False``
        (the fine-tuned weights as trained, which a resumed run continues from)."""
        try:
            state = unwrap_checkpoint(self.contents)
        except ConversionError as error:
            raise CheckpointError(f"{self.path}: {error}") from None
        record = self._ensembling_record
        return ensembled_state(state, record, where=str(self.path)) if ensembled and record is not None else state

    def require_spec(self) -> dict[str, Any]:
        """:attr:`spec`, or an error saying how to name the model instead."""
        if self.spec is None:
            raise CheckpointError(
                f"{self.path} does not say which model it holds (no {SPEC_KEY!r}); name the architecture "
                "instead: aggzoo.create_model('<head>_<backbone>', checkpoint_path=...)")
        return self.spec


def read_checkpoint(path: str | os.PathLike, *, sha256: str | None = None) -> CheckpointFile:
    """Read a checkpoint file without running any code from it: the one reader of every path that
    turns a file into a model (``create_model``, ``eval.py``, ``train.py ckpt_path=``, export,
    ``manifest``).

    The sha256 is checked first (when given). Safetensors files are recognised by content;
    everything else goes through ``torch.load(weights_only=True)``. A recorded model spec is
    validated against the builder's allowlist here, so a file naming any other code is refused
    (:class:`~aggzoo.errors.UnsafeSpecError`) before anything is built.
    """
    path = Path(path).expanduser()
    if path.is_dir():
        raise CheckpointError(f"{path} is a folder, not a checkpoint file (a folder written by "
                              "save_pretrained loads as local-dir:<folder>; a run folder resumes with ckpt_path=<run>)")
    if not path.is_file():
        raise WeightsUnavailableError(f"checkpoint file not found: {path}")
    _check_sha256(path, sha256)
    spec: Any = None
    if _is_safetensors(path):
        try:
            contents: Any = load_file(str(path), device="cpu")
            with safe_open(str(path), framework="pt") as file:
                text = (file.metadata() or {}).get(SPEC_KEY)
        except Exception as error:  # noqa: BLE001 - safetensors raises its own error types
            raise CheckpointError(f"{path} is not a valid safetensors file ({error}); fetch or copy it again") from None
        try:
            spec = json.loads(text) if text else None
        except json.JSONDecodeError:
            raise CheckpointError(f"{path}: its {SPEC_KEY!r} metadata is not valid JSON") from None
    else:
        contents = _torch_load_weights_only(path)
        spec = contents.get(SPEC_KEY) if isinstance(contents, Mapping) else None
    return CheckpointFile(path, contents, None if spec is None else normalise_spec(spec, where=str(path)))


# -- Downloading into the cache --------------------------------------------------------------------
#
# The hub clients do the transfers: huggingface_hub for Hugging Face sources (its cache under
# HF_HUB_CACHE, shared with every other tool; HF_TOKEN; HF_ENDPOINT mirrors; resumable downloads)
# and torch.hub's helper for plain URLs (a progress bar on stderr; written to a ``.partial`` file
# beside the target and moved into place only when complete). What stays ours: the sha256 pin
# checked on every use, and the offline message that says which file to place where.


def download(url: str, destination: Path, *, sha256: str | None, name: str) -> Path:
    """Download ``url`` to ``destination`` with :func:`torch.hub.download_url_to_file`. With ``sha256``
    pinned, a file with another digest is never moved into place (:class:`ChecksumMismatchError`)."""
    if _offline():
        raise WeightsUnavailableError(_offline_message(name, url, destination, sha256, "offline mode is set"))
    destination.parent.mkdir(parents=True, exist_ok=True)
    try:
        torch.hub.download_url_to_file(url, str(destination), hash_prefix=sha256, progress=True)
    except RuntimeError as error:
        if sha256 is None or "invalid hash value" not in str(error):
            raise
        got = re.search(r'got "([0-9a-f]{64})"', str(error))
        raise ChecksumMismatchError(
            f"{url} downloaded with sha256 {got.group(1) if got else '(another digest)'}, expected {sha256}: it is "
            f"not the published file (or the transfer was corrupted), so it was not kept at {destination}."
        ) from None
    except (urllib.error.URLError, OSError, ValueError) as error:  # ValueError: not a URL urllib can open
        raise WeightsUnavailableError(_offline_message(name, url, destination, sha256, _reason(error))) from None
    return destination


def _reason(error: BaseException) -> str:
    """One short clause for an error of a transfer (the hub clients' messages run over several lines)."""
    if isinstance(error, urllib.error.HTTPError):
        return f"HTTP {error.code} {error.reason}"
    text = str(getattr(error, "reason", None) or error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:300]}" if text else type(error).__name__


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


def _hf_download(repo_id: str, filename: str, *, revision: str | None = None) -> Path:
    """``filename`` of the Hugging Face repository ``repo_id`` through :func:`huggingface_hub.hf_hub_download`:
    its cache first, else a download (none when offline). Raises the hub client's own errors."""
    return Path(hf_hub_download(repo_id, filename, revision=revision, local_files_only=_offline()))


def _hf_reason(error: BaseException) -> str:
    # Offline, huggingface_hub's own words are about its local_files_only argument, which users never set.
    return "offline mode is set (AGGZOO_OFFLINE / HF_HUB_OFFLINE), and it is not in the Hugging Face cache" if (
        _offline()) else _reason(error)


#: What huggingface_hub raises when a file cannot be had: HTTP errors (401/403 gated, 404 repository or
#: file), "not in the cache" (offline or no connection), an invalid repository id, a disk error.
_HF_ERRORS = (HfHubHTTPError, EntryNotFoundError, HFValidationError, OSError)


def fetch_weights(cfg: PretrainedCfg) -> Path:
    """A local path holding the weights of ``cfg``: the shipped file, a file placed by hand in the
    cache folder, the Hugging Face cache (or a fresh download into it), then the URL (cached in
    ``cache_dir()/<name>``). The sha256 is checked on every use."""
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
    # One cache folder per model name, so file names never collide; cfg.filename renames every source.
    hf_name = cfg.filename or cfg.hf_hub_filename
    url_name = cfg.filename or (_url_filename(cfg.url) if cfg.url is not None else None)
    placed = [n for n in dict.fromkeys((hf_name, url_name, cfg.filename)) if n is not None]
    manual = placed[0] if placed else None
    # A file placed by hand (the offline message's "Place at") wins over every download.
    for filename in placed:
        cached = folder / filename
        if cached.is_file():
            _check_sha256(cached, cfg.sha256)
            _warn_unpinned(cfg, cached)
            return cached
    if not cfg.has_weights:
        raise WeightsUnavailableError(f"{cfg.name} has no weights source (file, url, hf_hub_id or download_page)")
    errors: list[str] = []
    if cfg.hf_hub_id is not None and cfg.hf_hub_filename is not None:
        try:
            path = _hf_download(cfg.hf_hub_id, cfg.hf_hub_filename)
        except _HF_ERRORS as error:
            errors.append(_offline_message(cfg.name, cfg.hf_url or cfg.hf_hub_id,
                                           folder / (hf_name or cfg.hf_hub_filename), cfg.sha256, _hf_reason(error)))
        else:
            # The cache's snapshot entry links to a blob: name the blob, the file to delete if it is wrong.
            _check_sha256(path.resolve(), cfg.sha256)
            _warn_unpinned(cfg, path)
            return path
    if cfg.url is not None and url_name is not None:
        try:
            path = download(cfg.url, folder / url_name, sha256=cfg.sha256, name=cfg.name)
        except WeightsUnavailableError as error:
            errors.append(str(error))
        else:
            _warn_unpinned(cfg, path)
            return path
    if cfg.download_page is not None and manual is not None:
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


# -- Putting a state dict into a model -------------------------------------------------------------


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

    A module with an ``adopt_state_shapes(state, prefix)`` method first reshapes what it can take at
    another shape (a DINOv2 backbone's position grid, :class:`~aggzoo.models.backbones.timm_backbone.TimmBackbone`),
    as ``load_state_dict``'s pre-hooks do.
    """
    for name, module in model.named_modules():
        adopt = getattr(module, "adopt_state_shapes", None)
        if callable(adopt):
            adopt(state, f"{name}." if name else "")
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
    """Read a checkpoint file safely (:func:`read_checkpoint`), remap its keys (the named function of
    the method's zoo file, or ``None`` for aggzoo's own names) and load it strictly into ``model``."""
    state = read_checkpoint(path, sha256=sha256).state_dict()
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


# -- save_pretrained / local folders ---------------------------------------------------------------


def save_pretrained(
    model: nn.Module,
    directory: str | os.PathLike,
    *,
    spec: Mapping[str, Any] | None = None,
    pretrained_cfg: PretrainedCfg | None = None,
    run_summary: str | os.PathLike | None = None,
    test_results: str | os.PathLike | None = None,
    license: str | None = None,
    repo_id: str | None = None,
) -> Path:
    """Write ``model`` as a Hugging Face model repository folder: ``model.safetensors``, ``config.json``
    (the spec the one builder reads; never code) and a ``README.md`` model card. It loads back with
    ``aggzoo.create_model("local-dir:<directory>")``, or ``"hf-hub:<repo>"`` once pushed
    (:func:`aggzoo.hub.publish.push_to_hub`).

    Args:
        model: a :class:`~aggzoo.models.VPRModel`.
        spec: how to rebuild it -- ``{"backbone": {"_target_": ..., <kwargs>}, "head": {"_target_":
            ..., <kwargs>}}``, the same shape as the Hydra ``conf/backbone`` and ``conf/head`` files.
            Defaults to the spec ``create_model`` recorded on the model (``model.aggzoo_spec``).
        pretrained_cfg: preprocessing and provenance to record (defaults to ``model.pretrained_cfg``).
        run_summary / test_results: the training run's ``run_summary.json`` / ``test_results.json``
            (or eval.py's ``results.json``): the card's recipe and results table.
        license: the card's licence (defaults to the pretrained cfg's).
        repo_id: ``<owner>/<repo>`` named in the card's loading snippet.

    All tensors are saved (the backbone's ``pretrained`` flag is cleared in the saved spec: the
    weights come from the file).
    """
    spec = spec if spec is not None else getattr(model, "aggzoo_spec", None)
    if spec is None:
        raise ConfigError(
            "save_pretrained needs to know how to rebuild this model: it was not built by "
            "aggzoo.create_model, so pass spec={'backbone': {...}, 'head': {...}} (the contents of the "
            "Hydra conf/backbone and conf/head entries it was built from)."
        )
    spec = normalise_spec(spec)
    spec["backbone"]["pretrained"] = False
    cfg = pretrained_cfg if pretrained_cfg is not None else getattr(model, "pretrained_cfg", None)
    out_dim = getattr(model, "out_dim", None)
    architecture = getattr(model, "aggzoo_architecture", None)
    config: dict[str, Any] = {
        "format": _CONFIG_FORMAT,
        "architecture": architecture,
        "spec": spec,
        "out_dim": out_dim,
        "pretrained_cfg": _cfg_for_json(cfg) if cfg is not None else None,
    }
    card = model_card(spec=spec, architecture=architecture, out_dim=out_dim, cfg=cfg, repo_id=repo_id, license=license,
                      run_summary=read_results_file(run_summary) if run_summary is not None else None,
                      test_results=read_results_file(test_results) if test_results is not None else None)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_weights(model.state_dict(), directory / WEIGHTS_FILE, metadata={"format": _CONFIG_FORMAT, SPEC_KEY: json.dumps(spec)})
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    card.save(directory / CARD_FILE)
    return directory


def save_weights(tensors: Mapping[str, Tensor], path: str | Path, metadata: Mapping[str, str]) -> Path:
    """Write ``tensors`` to a ``.safetensors`` file whose bytes depend only on its contents.

    safetensors orders the header's ``__metadata__`` map differently from one process to the next (a Rust
    hash map), so the same tensors gave files of different sha256. The header is rewritten with that map
    in sorted key order: same keys, same length, so no tensor offset moves. Tensors are copied to
    contiguous CPU clones first (safetensors refuses views that share storage).
    """
    path = Path(path)
    save_file({k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}, str(path),
              metadata=dict(metadata))
    with path.open("r+b") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
        header["__metadata__"] = dict(sorted(header.get("__metadata__", {}).items()))
        text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
        if len(text) > length:  # cannot happen for a reordering; never write a header that does not fit
            raise CheckpointError(f"{path}: the sorted safetensors header is longer than the original")
        f.seek(8)
        f.write(text.ljust(length))  # the format pads headers with spaces
    return path


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
    try:
        config = json.loads(config_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{config_path} is not valid JSON ({error}); fetch or copy the folder again") from None
    if not isinstance(config, dict) or config.get("format") != _CONFIG_FORMAT:
        found = config.get("format") if isinstance(config, dict) else type(config).__name__
        raise CheckpointError(f"{config_path}: unknown format {found!r}, expected {_CONFIG_FORMAT!r}")
    config["spec"] = normalise_spec(config.get("spec"), where=str(config_path))
    return config, weights_path


def hf_hub_folder(repo: str) -> Path:
    """A save_pretrained folder of the Hugging Face Hub (``<owner>/<repo>[@<revision>]``), from the
    Hugging Face cache or downloaded into it with :func:`huggingface_hub.hf_hub_download` (``HF_TOKEN``,
    ``HF_ENDPOINT`` and ``HF_HUB_CACHE`` apply). Both files come from one commit. A copy placed by hand
    in ``cache_dir()/hf-hub/<owner>--<repo>`` (the offline message's place) is used first."""
    repo_id, _, revision = repo.strip().strip("/").partition("@")
    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise ConfigError(f"hf-hub names read 'hf-hub:<owner>/<repo>[@<revision>]', got {repo!r}")
    manual = cache_dir() / "hf-hub" / repo_id.replace("/", "--")
    if all((manual / name).is_file() for name in (CONFIG_FILE, WEIGHTS_FILE)):
        return manual
    try:
        config = _hf_download(repo_id, CONFIG_FILE, revision=revision or None)
        # The snapshot folder is named by the commit the revision resolved to: the weights of that commit.
        _hf_download(repo_id, WEIGHTS_FILE, revision=config.parent.name)
    except _HF_ERRORS as error:
        files = "".join(f"  Download:  {hf_hub_url(repo_id, name, revision=revision or None)}\n"
                        f"  Place at:  {manual / name}\n" for name in (CONFIG_FILE, WEIGHTS_FILE))
        raise WeightsUnavailableError(
            f"hf-hub:{repo} could not be had ({_hf_reason(error)}).\n"
            f"{files}Then call again; or load any folder holding both with create_model('local-dir:<folder>')."
        ) from None
    return config.parent
