"""A folder of extracted descriptors reused across evaluations: the +1M distractors are extracted once per model.

Extracting the revisitop 1M distractors takes hours; their descriptors depend only on the model (its class
and weights), the protocol (the transform), what changes the numbers (descriptor dtype, autocast precision,
memory format, test-time scales) and the image list -- not on the benchmark they are appended to, nor on the
search. So ``roxford5k_r1m`` and ``rparis6k_r1m`` of one model, or a second run with another index, share one
extraction. Each entry is ``<folder>/<key>.npy`` (the ``[N, D]`` descriptors) with ``<key>.json`` beside it
(what the key was made of, the array's shape, dtype and sha256); ``key`` is the sha256 of that description.

What is cached (:meth:`DescriptorCache.database`): the distractor rows of a benchmark
(:attr:`~aggzoo.data.retrieval_set.RetrievalSet.distractors`, the database's last rows), which other
benchmarks share; a benchmark without distractors has its whole database cached (a second run of the same
model skips extraction). Queries are never cached (a few dozen images, cropped per benchmark).

Nothing in the folder is trusted: an entry is used only when its ``.json`` parses, names the same key,
shape and dtype, and the ``.npy`` (read with ``allow_pickle=False``, memory-mapped) has that header and
hashes to the recorded sha256; anything else is a miss, logged, and the entry is extracted again. Entries
are written under temporary names and renamed into place (the ``.npy`` first, then the ``.json`` that
makes it valid), so an interrupted run leaves no entry that looks complete.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from aggzoo.data.retrieval_set import RetrievalSet
from aggzoo.evaluation.extraction import open_store
from aggzoo.evaluation.index import row_chunks
from aggzoo.evaluation.options import EvaluationOptions

__all__ = ["DescriptorCache", "model_digest"]

log = logging.getLogger(__name__)

_HASH_BLOCK = 64 << 20  # bytes read at a time when hashing a cached array


def model_digest(model: nn.Module) -> str:
    """sha256 of the model's class and every ``state_dict`` entry (name, dtype, shape, bytes), in name order:
    one changed parameter or buffer changes it; the same weights loaded twice give the same digest."""
    digest = hashlib.sha256(f"{type(model).__module__}.{type(model).__qualname__}".encode())
    for name, value in sorted(model.state_dict().items()):
        digest.update(name.encode())
        if isinstance(value, torch.Tensor):
            tensor = value.detach().to("cpu").contiguous()
            digest.update(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
            digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
        else:  # extra state: its repr is what identifies it
            digest.update(repr(value).encode())
    return digest.hexdigest()


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


class DescriptorCache:
    """Extracted descriptors in ``folder``, keyed by model, protocol, extraction options and image list."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder).expanduser()

    def __repr__(self) -> str:
        return f"DescriptorCache({str(self.folder)!r})"

    def describe(self, model: nn.Module, paths: Sequence[Any], transform: Any, options: EvaluationOptions,
                 weights: str | None = None) -> dict[str, Any]:
        """What the descriptors of ``paths`` depend on (the key is its sha256). ``weights``: the model's
        :func:`model_digest`, when the caller computed it already."""
        extraction, test_time = options.extraction, options.test_time
        return {
            "model": f"{type(model).__module__}.{type(model).__qualname__}",
            "weights": weights or model_digest(model),
            "protocol": repr(transform),
            "descriptor_dtype": str(np.dtype(extraction.descriptor_dtype)),
            "precision": extraction.precision,
            "channels_last": bool(extraction.channels_last),
            "test_time": {"scales": list(test_time.scales), "multiscale_reduce": test_time.multiscale_reduce,
                          "tlc_train_size": test_time.tlc_train_size,
                          **({"multiscale_interpolation": test_time.multiscale_interpolation}
                             if test_time.multiscale_interpolation != "bicubic" else {}),
                          **({"multiple": test_time.multiple}
                             if test_time.multiple is not None and tuple(test_time.scales) != (1.0,) else {}),
                          **({"pooling": test_time.pooling, "relu_floor": test_time.relu_floor}
                             if test_time.pooling is not None else {})},
            "images": len(paths),
            "paths_sha256": hashlib.sha256("\n".join(str(p) for p in paths).encode()).hexdigest(),
        }

    @staticmethod
    def key(description: dict[str, Any]) -> str:
        return hashlib.sha256(json.dumps(description, sort_keys=True, default=str).encode()).hexdigest()

    def lookup(self, key: str, description: dict[str, Any]) -> np.ndarray | None:
        """The cached ``[N, D]`` array of ``key`` (memory-mapped, read-only), or ``None`` when there is none or
        it fails any check (logged)."""
        array_path, meta_path = self.folder / f"{key}.npy", self.folder / f"{key}.json"
        if not array_path.exists() or not meta_path.exists():
            return None
        try:
            meta = json.loads(meta_path.read_text())
            array = np.load(array_path, mmap_mode="r", allow_pickle=False)
            problem = None
            if not isinstance(meta, dict) or meta.get("key") != key or meta.get("description") != description:
                problem = "its record names another key"
            elif array.ndim != 2 or array.shape[0] != description["images"] or list(array.shape) != meta.get("shape"):
                problem = f"shape {array.shape} does not match the record"
            elif str(array.dtype) != description["descriptor_dtype"]:
                problem = f"dtype {array.dtype} is not {description['descriptor_dtype']}"
            elif _file_sha256(array_path) != meta.get("sha256"):
                problem = "its contents do not hash to the recorded sha256"
        except (OSError, ValueError, TypeError, json.JSONDecodeError) as error:
            problem = f"it cannot be read ({type(error).__name__}: {error})"
        if problem is not None:
            log.warning("descriptor cache %s: ignoring %s.npy (%s); extracting again", self.folder, key, problem)
            return None
        return array

    def store(self, key: str, description: dict[str, Any], fill: Callable[[Path], np.ndarray]) -> np.ndarray:
        """Run ``fill(path) -> array`` (writes the ``.npy`` at ``path``), record it, and rename it into place;
        returns the stored array, memory-mapped read-only."""
        self.folder.mkdir(parents=True, exist_ok=True)
        handle, tmp_name = tempfile.mkstemp(dir=self.folder, prefix=f".{key}.", suffix=".npy")
        os.close(handle)
        tmp = Path(tmp_name)
        try:
            array = fill(tmp)
            shape, dtype = list(array.shape), str(array.dtype)
            del array
            meta = {"key": key, "description": description, "shape": shape, "dtype": dtype,
                    "sha256": _file_sha256(tmp)}
            os.replace(tmp, self.folder / f"{key}.npy")
            handle, meta_tmp = tempfile.mkstemp(dir=self.folder, prefix=f".{key}.", suffix=".json")
            with os.fdopen(handle, "w") as out:
                json.dump(meta, out, indent=1, sort_keys=True)
            os.replace(meta_tmp, self.folder / f"{key}.json")
        finally:
            tmp.unlink(missing_ok=True)
        return np.load(self.folder / f"{key}.npy", mmap_mode="r", allow_pickle=False)

    def descriptors(self, extract: Callable[..., np.ndarray], model: nn.Module, paths: Sequence[Any], transform: Any,
                    options: EvaluationOptions, desc: str = "descriptors") -> np.ndarray:
        """``extract(model, paths, transform, options.extraction, out_path=..., desc=...)``, or its cached
        result for the same model, weights, protocol, options and paths."""
        description = self.describe(model, paths, transform, options)
        key = self.key(description)
        cached = self.lookup(key, description)
        if cached is not None:
            log.info("%s: %d descriptors from the cache %s", desc, len(cached), self.folder / f"{key}.npy")
            return cached
        return self.store(key, description,
                          lambda path: extract(model, paths, transform, options.extraction, out_path=path, desc=desc))

    def database(self, extract: Callable[..., np.ndarray], model: nn.Module, retrieval_set: RetrievalSet,
                 transform: Any, options: EvaluationOptions, out_path: Path | None = None) -> np.ndarray:
        """The ``[N, D]`` database descriptors of ``retrieval_set``: its distractor rows from the cache (or the
        whole database, when it has none), the benchmark's own images extracted as usual; in RAM, or
        written to the memory-mapped ``out_path`` (the two-stage disk store)."""
        paths, name = retrieval_set.database_paths, retrieval_set.name
        if retrieval_set.distractors == 0:
            cached = self.descriptors(extract, model, paths, transform, options, f"{name} database")
            return _copy_rows([cached], out_path) if out_path is not None else cached
        own = len(paths) - retrieval_set.distractors
        parts = [extract(model, paths[:own], transform, options.extraction, desc=f"{name} database")] if own else []
        parts.append(self.descriptors(extract, model, paths[own:], transform, options, f"{name} distractors"))
        return _copy_rows(parts, out_path)


def _copy_rows(parts: Sequence[np.ndarray], out_path: Path | None, chunk: int = 65536) -> np.ndarray:
    """``parts`` stacked row-wise, into RAM or a memory-mapped ``.npy`` at ``out_path``, a chunk at a time
    (a cached 1M x 2048 array is never read whole)."""
    if out_path is None:
        return np.concatenate([np.asarray(p) for p in parts])
    rows = sum(len(p) for p in parts)
    out = open_store(out_path, parts[0].dtype, (rows, parts[0].shape[1]))
    start = 0
    for part in parts:
        for block in row_chunks(len(part), chunk):
            out[start + block.start:start + block.stop] = part[block]
        start += len(part)
    out.flush()
    return out
