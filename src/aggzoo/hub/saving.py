"""The folder :func:`save_pretrained` writes, and reading it back: a Hugging Face model repository.

A saved folder holds ``model.safetensors`` (every tensor; the spec again in its metadata),
``config.json`` (the spec the one builder reads, the architecture name, the
descriptor size and the preprocessing; never code) and a ``README.md`` model card
(:mod:`aggzoo.hub.card`). ``aggzoo.create_model("local-dir:<folder>")`` loads it back through
:func:`read_local_dir`; ``"hf-hub:<owner>/<repo>"`` fetches the same two files first
(:func:`aggzoo.hub.download.hf_hub_folder`).

Both files get the permissions of any file the process creates (``0666`` less the umask), so others
in a group can read the weights as they can read the config.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from safetensors.torch import save_file
from torch import Tensor, nn

from aggzoo.errors import CheckpointError, ConfigError, WeightsUnavailableError
from aggzoo.hub.builder import normalise_spec
from aggzoo.hub.card import CARD_FILE, model_card, read_results_file
from aggzoo.hub.cfg import PretrainedCfg
from aggzoo.hub.checkpoint import SPEC_KEY

__all__ = ["CONFIG_FILE", "WEIGHTS_FILE", "read_local_dir", "save_pretrained", "save_weights"]

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
_CONFIG_FORMAT = "aggzoo.save_pretrained/1"


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
    contiguous CPU clones first (safetensors refuses views that share storage). The file gets the mode
    ``open()`` gives a new file (``0666`` less the umask), not safetensors' private ``0600``.
    """
    path = Path(path)
    save_file({k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}, str(path),
              metadata=dict(metadata))
    # safetensors writes a private temporary file (mode 0600) beside the target and renames it into place.
    os.chmod(path, 0o666 & ~_umask())
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


def _umask() -> int:
    """The process's umask. Linux shows it in ``/proc/self/status``, read without changing it;
    elsewhere it is set and restored at once (``os.umask`` is the only call that returns it)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask
