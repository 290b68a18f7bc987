"""Reading and verifying a checkpoint file: the one reader every path that turns a file into a model uses.

Safe by construction:

- Nothing is unpickled with code execution. ``.safetensors`` files hold only tensors; anything else
  is read with ``torch.load(..., weights_only=True)``, whose unpickler refuses every global outside
  torch's tensor types (plus the numpy scalar types some training scripts store), so a pickle whose
  ``__reduce__`` would run code is rejected before anything runs (:class:`UnsafeCheckpointError`).
- naver/deep-image-retrieval (dirtorch) checkpoints keep their learned whitenings beside the weights as
  fitted scikit-learn ``PCA`` objects (``{"pca": {name: PCA}}``). Their pickled class name resolves to
  :class:`PickledEstimator`, which keeps the fields as data and imports or runs nothing of scikit-learn;
  :func:`unwrap_checkpoint` adds them to the state dict as ``pca.<name>.<field>`` tensors.
- MATLAB files (``.mat`` version 5/7: MatConvNet networks such as NetVLAD's released VGG16) are parsed by
  ``scipy.io.loadmat``, a data format with no code in it; their numeric arrays become tensors named by
  their path in the structure (``net.layers.30.weights.0``), for the method's converter to rename.
- A file whose sha256 differs from the pinned digest is refused before it is parsed
  (:class:`ChecksumMismatchError`).
- The model a file describes (a training checkpoint's or a saved folder's spec) is validated by
  :func:`aggzoo.hub.builder.normalise_spec` as it is read: a spec naming anything but aggzoo's own
  model classes is refused here, before any model is built.
- A truncated, empty or foreign file is one :class:`CheckpointError` naming it, never torch's
  traceback or its advice to retry with ``weights_only=False``.

:class:`CheckpointFile` is what was read: the contents as stored, the recorded spec, and the model's
state dict unwrapped from the container a training script saved it in (with the weight-ensembling
record applied, :mod:`aggzoo.hub.ensembling`). Putting it into a model is :mod:`aggzoo.hub.loading`'s job.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from scipy.io import loadmat
from scipy.io.matlab import mat_struct
from torch import Tensor

from aggzoo.errors import (
    CheckpointError,
    ChecksumMismatchError,
    ConversionError,
    UnsafeCheckpointError,
    WeightsUnavailableError,
)
from aggzoo.hub.builder import normalise_spec
from aggzoo.hub.ensembling import ensembled_state, ensembling_record, recorded_alpha
from aggzoo.hub.remap import is_state_dict, show_keys, strip_prefix

__all__ = ["BARE_TENSOR_KEY", "SPEC_KEY", "CheckpointFile", "PickledEstimator", "check_sha256", "read_checkpoint",
           "sha256_of",
           "unwrap_checkpoint"]

#: Where a checkpoint of the training pipeline keeps the backbone + head spec that rebuilds its
#: model, and where save_pretrained's safetensors metadata does.
SPEC_KEY = "aggzoo_model_config"
#: The one key of the state dict of a file that holds a single bare tensor (``torch.save(tensor)``: AnyLoc's
#: released vocabularies, ``c_centers.pt``); that method's converter gives it its model key.
BARE_TENSOR_KEY = "<tensor>"


def sha256_of(path: str | os.PathLike) -> str:
    """The hex sha256 of the file at ``path``, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_sha256(path: Path, expected: str | None) -> None:
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


def _is_matlab(path: Path) -> bool:
    # MAT-files start with a 116-byte text header "MATLAB 5.0 MAT-file, ..." (7.3 files: "MATLAB 7.3 ...").
    with path.open("rb") as file:
        return file.read(7) == b"MATLAB "


def _read_matlab(path: Path) -> dict[str, Tensor]:
    """Every numeric array of a MAT-file as a tensor named by its path in the structure
    (``net.layers.30.weights.0``: struct fields by name, cell and struct-array entries by index)."""
    try:
        data = loadmat(str(path), struct_as_record=False, squeeze_me=True)
    except NotImplementedError:
        raise CheckpointError(f"{path} is a MATLAB 7.3 (HDF5) file; save it in MATLAB with '-v7' to read it here") from None
    except Exception as error:  # noqa: BLE001 - scipy raises many types for a damaged file
        raise CheckpointError(f"{path} is not a readable MATLAB file ({error}); fetch or copy it again") from None
    out: dict[str, Tensor] = {}
    for key, value in data.items():
        if not key.startswith("__"):  # __header__, __version__, __globals__
            _flatten_matlab(value, key, out)
    return out


def _flatten_matlab(value: Any, prefix: str, out: dict[str, Tensor]) -> None:
    if isinstance(value, mat_struct):
        for field in value._fieldnames:
            _flatten_matlab(getattr(value, field), f"{prefix}.{field}", out)
    elif isinstance(value, np.ndarray) and value.dtype == object:
        for index, item in enumerate(value.flat):
            _flatten_matlab(item, f"{prefix}.{index}", out)
    elif isinstance(value, np.ndarray) and value.dtype.kind in "fiub":
        out[prefix] = torch.from_numpy(np.ascontiguousarray(value))
    elif isinstance(value, (bool, int, float, np.number)):
        out[prefix] = torch.as_tensor(value)
    # text (layer names, types) carries no weights


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


class PickledEstimator:
    """The fields of a pickled scikit-learn estimator (``mean_``, ``components_``, ...), kept as data: the
    unpickler builds this inert record under the estimator's class name, so scikit-learn is never imported
    and none of its methods run."""

    fields: dict[str, Any]

    def __setstate__(self, state: Any) -> None:
        self.fields = dict(state) if isinstance(state, Mapping) else {}


# The estimators a checkpoint may carry as data: dirtorch's PCA whitenings, pickled by scikit-learn < 0.22
# (``sklearn.decomposition.pca``) or later (``sklearn.decomposition._pca``).
_ESTIMATOR_NAMES = ("sklearn.decomposition.pca.PCA", "sklearn.decomposition._pca.PCA")


def _numpy_array_globals() -> list[Any]:
    """numpy's array reconstructors under both spellings of its core package (numpy 1.x files say
    ``numpy.core``, numpy 2 ``numpy._core``): they allocate an array and copy bytes into it, nothing else."""
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy 1.x
        from numpy.core.multiarray import _reconstruct

    return [np.ndarray, *((_reconstruct, f"{core}.multiarray._reconstruct") for core in ("numpy.core", "numpy._core"))]


def _data_globals() -> list[Any]:
    """What a weights-only load may resolve beyond torch's tensors: numpy scalars and arrays, and the
    inert :class:`PickledEstimator` under the allowed estimator names."""
    return [*_numpy_scalar_globals(), *_numpy_array_globals(), *((PickledEstimator, name) for name in _ESTIMATOR_NAMES)]


def _torch_load_weights_only(path: Path) -> Any:
    try:
        with torch.serialization.safe_globals(_data_globals()):
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
# CricaVPR) saves {"model_state_dict": ...}; pycls and its descendants (DELG-pytorch, CVNet) save
# {"model_state": ...}; several others save {"model": ...}.
_CONTAINER_KEYS = ("state_dict", "model_state_dict", "model_state", "model")
_DATA_PARALLEL = "module."
# A LightningModule of our own pipeline holds the VPRModel as ``self.model``.
_LIGHTNING_MODEL = "model."
_OUR_ROOTS = ("backbone.", "head.")


def unwrap_checkpoint(obj: object) -> dict[str, Tensor]:
    """The state dict inside whatever a training script saved.

    Accepts a raw state dict, Lightning's ``{"state_dict": ...}``, ``{"model_state_dict": ...}``,
    pycls' ``{"model_state": ...}`` and ``{"model": ...}``, or one bare tensor (as ``{BARE_TENSOR_KEY: tensor}``);
    removes the ``module.`` prefix ``nn.DataParallel`` adds; and, for a
    checkpoint of aggzoo's own Lightning module (keys ``model.backbone.*`` / ``model.head.*``),
    keeps the model's keys without the ``model.`` prefix (loss or metric state is dropped).
    """
    if isinstance(obj, Tensor):
        return {BARE_TENSOR_KEY: obj}
    found = obj
    if not is_state_dict(found):
        if not isinstance(found, Mapping):
            raise ConversionError(f"expected a state dict (a mapping of names to tensors), got {type(found).__name__}")
        for key in _CONTAINER_KEYS:
            if key in found and is_state_dict(found[key]):
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
    return state | _whitening_tensors(obj)


# The fitted fields of a PCA whitening that converters read (naver/deep-image-retrieval's whiten_features).
_PCA_FIELDS = ("mean_", "components_", "explained_variance_", "whiten")


def _whitening_tensors(obj: object) -> dict[str, Tensor]:
    """``pca.<name>.<field>`` tensors of the PCA whitenings a dirtorch checkpoint stores under ``"pca"``."""
    whitenings = obj.get("pca") if isinstance(obj, Mapping) else None
    if not isinstance(whitenings, Mapping):
        return {}
    out: dict[str, Tensor] = {}
    for name, estimator in whitenings.items():
        if not isinstance(estimator, PickledEstimator):
            continue
        for field in _PCA_FIELDS:
            value = estimator.fields.get(field)
            if isinstance(value, (np.ndarray, bool, np.bool_)):
                out[f"pca.{name}.{field}"] = torch.as_tensor(np.asarray(value))
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
    def ensembling_alpha(self) -> float | None:
        """The WiSE-FT coefficient the file records (:data:`~aggzoo.hub.ensembling.ENSEMBLING_KEY`),
        ``None`` when it records none."""
        return recorded_alpha(self.contents)

    def state_dict(self, *, ensembled: bool = True) -> dict[str, Tensor]:
        """The model's state dict, unwrapped (:func:`unwrap_checkpoint`); for a checkpoint that records
        weight ensembling, the ensembled weights (:func:`~aggzoo.hub.ensembling.ensembled_state`) unless
        ``ensembled=False`` (the fine-tuned weights as trained, which a resumed run continues from)."""
        try:
            state = unwrap_checkpoint(self.contents)
        except ConversionError as error:
            raise CheckpointError(f"{self.path}: {error}") from None
        record = ensembling_record(self.contents)
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

    The sha256 is checked first (when given). Safetensors and MATLAB files are recognised by content;
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
    check_sha256(path, sha256)
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
    elif _is_matlab(path):
        contents = _read_matlab(path)
    else:
        contents = _torch_load_weights_only(path)
        spec = contents.get(SPEC_KEY) if isinstance(contents, Mapping) else None
    return CheckpointFile(path, contents, None if spec is None else normalise_spec(spec, where=str(path)))
