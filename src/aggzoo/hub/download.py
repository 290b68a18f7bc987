"""Where weights live and how they get there: the shipped folder, the download cache, the Hugging Face Hub.

- ``weights/`` (or ``$AGGZOO_WEIGHTS_DIR``): weights shipped with aggzoo, listed in
  ``weights/manifest.json``; the package reaches it as ``aggzoo/weights`` (a link in a checkout, a
  copy inside an installed wheel).
- ``$AGGZOO_CACHE`` (default ``$XDG_CACHE_HOME/aggzoo`` or ``~/.cache/aggzoo``): plain-URL downloads, one
  folder per model name, and the place for a file copied by hand.
- The Hugging Face cache (``HF_HUB_CACHE``, default ``~/.cache/huggingface/hub``): Hugging Face
  sources, shared with every other tool that uses ``huggingface_hub``.

The hub clients do the transfers: huggingface_hub for Hugging Face sources (its cache, ``HF_TOKEN``,
``HF_ENDPOINT`` mirrors, resumable downloads) and torch.hub's helper for plain URLs (a progress bar on
stderr; written to a ``.partial`` file beside the target and moved into place only when complete).
What stays ours: the sha256 pin checked on every use (:func:`aggzoo.hub.checkpoint.check_sha256`), and
the offline message. On an offline machine (or with ``AGGZOO_OFFLINE=1`` / ``HF_HUB_OFFLINE=1``)
nothing is downloaded (the Hugging Face cache is still read); the error names the URL and the exact
path to place the file at.
"""

from __future__ import annotations

import os
import re
import urllib.error
import urllib.parse
import warnings
from pathlib import Path

import torch
from huggingface_hub import hf_hub_download, hf_hub_url
from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, HFValidationError

from aggzoo.errors import ChecksumMismatchError, ConfigError, WeightsUnavailableError
from aggzoo.hub.cfg import PretrainedCfg
from aggzoo.hub.checkpoint import check_sha256, sha256_of
from aggzoo.hub.saving import CONFIG_FILE, WEIGHTS_FILE

__all__ = ["cache_dir", "download", "fetch_weights", "hf_hub_folder", "weights_dir"]

_OFFLINE_ENV = ("AGGZOO_OFFLINE", "HF_HUB_OFFLINE")


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
        check_sha256(path, cfg.sha256)
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
            check_sha256(cached, cfg.sha256)
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
            check_sha256(path.resolve(), cfg.sha256)
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
