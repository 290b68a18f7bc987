"""Downloads go through the hub clients, against real servers on 127.0.0.1 (no network):
plain URLs through torch.hub's downloader (a progress bar, nothing half-written left behind, our
sha256 pin), Hugging Face sources through ``huggingface_hub`` (its cache layout, ``HF_TOKEN``, the
endpoint ``HF_ENDPOINT`` sets), and the offline message says which file to place where."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
import torch
from hub_helpers import tiny_model
from hub_servers import LocalHub, serve_folder
from safetensors.torch import save_file

from aggzoo.errors import ChecksumMismatchError, WeightsUnavailableError
from aggzoo.hub.cfg import PretrainedCfg
from aggzoo.hub.download import cache_dir, fetch_weights
from aggzoo.hub.loading import load_checkpoint

REPO = "someone/tiny-gem"


@pytest.fixture(scope="module")
def weights_bytes(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, dict[str, torch.Tensor]]:
    """A real safetensors file of the tiny test model, as bytes, and its tensors."""
    torch.manual_seed(0)
    state = {k: v.clone() for k, v in tiny_model().state_dict().items()}
    path = tmp_path_factory.mktemp("w") / "tiny.safetensors"
    save_file(state, str(path))
    return path.read_bytes(), state


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _loads_the_same(path: Path, state: dict[str, torch.Tensor]) -> None:
    model = tiny_model()
    load_checkpoint(model, path)
    for key, value in state.items():
        assert torch.equal(model.state_dict()[key], value), key


# -- plain URLs: torch.hub.download_url_to_file -------------------------------------------------------


def test_url_download_shows_progress_is_cached_and_checked(online: dict[str, Path], tmp_path: Path, weights_bytes,
                                                           capfd: pytest.CaptureFixture[str]) -> None:
    data, state = weights_bytes
    (tmp_path / "releases").mkdir()
    (tmp_path / "releases" / "tiny.safetensors").write_bytes(data)
    with serve_folder(tmp_path / "releases") as (url, requests):
        cfg = PretrainedCfg(architecture="gem_testresnet", tag="url", url=f"{url}/tiny.safetensors", sha256=_sha(data))
        path = fetch_weights(cfg)
        assert path == online["cache"] / "gem_testresnet.url" / "tiny.safetensors"
        assert path.read_bytes() == data
        progress = capfd.readouterr().err
        # tqdm's bar, finished: "100%|██████████| 423k/423k [...]" (done == total, in KiB)
        done = re.search(r"100%\|[^|]*\| (\d+)k/(\d+)k", progress)
        assert done and done[1] == done[2] == f"{len(data) / 1024:.0f}", progress
        print(progress.strip().splitlines()[-1].split("\r")[-1], end="")  # for the report: pytest -s
        assert fetch_weights(cfg) == path  # the second use reads the cache ...
        assert requests == ["/tiny.safetensors"]  # ... and asks the server nothing
    _loads_the_same(path, state)


def test_url_with_another_digest_is_not_kept(online: dict[str, Path], tmp_path: Path, weights_bytes) -> None:
    data, _ = weights_bytes
    (tmp_path / "tiny.safetensors").write_bytes(data)
    with serve_folder(tmp_path) as (url, _):
        cfg = PretrainedCfg(architecture="gem_testresnet", tag="bad", url=f"{url}/tiny.safetensors", sha256="1" * 64)
        with pytest.raises(ChecksumMismatchError) as info:
            fetch_weights(cfg)
    assert _sha(data) in str(info.value) and "1" * 64 in str(info.value)
    # Neither the file nor torch.hub's .partial file is left in the cache folder.
    assert list((online["cache"] / "gem_testresnet.bad").iterdir()) == []


def test_url_not_found_says_what_to_place_where(online: dict[str, Path], tmp_path: Path) -> None:
    with serve_folder(tmp_path) as (url, _):
        cfg = PretrainedCfg(architecture="gem_testresnet", tag="gone", url=f"{url}/files/gone.pth", sha256="2" * 64)
        with pytest.raises(WeightsUnavailableError) as info:
            fetch_weights(cfg)
    message = str(info.value)
    assert "HTTP 404" in message
    assert f"Download:  {url}/files/gone.pth" in message
    assert f"Place at:  {online['cache'] / 'gem_testresnet.gone' / 'gone.pth'} (sha256 {'2' * 64})" in message


def test_offline_mode_asks_no_server(online: dict[str, Path], tmp_path: Path, weights_bytes,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    data, state = weights_bytes
    (tmp_path / "tiny.safetensors").write_bytes(data)
    monkeypatch.setenv("AGGZOO_OFFLINE", "1")
    with serve_folder(tmp_path) as (url, requests):
        cfg = PretrainedCfg(architecture="gem_testresnet", tag="off", url=f"{url}/tiny.safetensors", sha256=_sha(data))
        with pytest.raises(WeightsUnavailableError, match="offline mode is set") as info:
            fetch_weights(cfg)
        assert requests == []
        # The message's "Place at" is where a copied file is picked up.
        place = Path(str(info.value).split("Place at:  ")[1].split(" (sha256")[0])
        place.parent.mkdir(parents=True)
        place.write_bytes(data)
        assert fetch_weights(cfg) == place
    _loads_the_same(place, state)


# -- Hugging Face sources: huggingface_hub.hf_hub_download ---------------------------------------------


def test_hf_source_lands_in_the_hugging_face_cache(local_hub: LocalHub, weights_bytes, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    data, state = weights_bytes
    commit = local_hub.commit(REPO, {"weights/tiny.safetensors": data})
    cfg = PretrainedCfg(architecture="gem_testresnet", tag="hf", hf_hub_id=REPO,
                        hf_hub_filename="weights/tiny.safetensors", sha256=_sha(data))
    assert cfg.hf_url == f"{local_hub.url}/{REPO}/resolve/main/weights/tiny.safetensors"
    path = fetch_weights(cfg)
    # huggingface_hub's own layout: models--<owner>--<name>/snapshots/<commit>/<file> -> blobs/<etag>
    expected = tmp_path / "hf_cache" / "models--someone--tiny-gem" / "snapshots" / commit / "weights" / "tiny.safetensors"
    assert path == expected and path.resolve().parent.name == "blobs" and path.read_bytes() == data
    assert not (cache_dir() / cfg.name).exists()  # nothing duplicated in aggzoo's own cache
    _loads_the_same(path, state)
    # Offline, the Hugging Face cache still answers, without a request.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    seen = len(local_hub.requests)
    assert fetch_weights(cfg) == path and len(local_hub.requests) == seen


def test_hf_private_repo_needs_hf_token(local_hub: LocalHub, weights_bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    data, _ = weights_bytes
    local_hub.create("someone/private", private=True)
    local_hub.commit("someone/private", {"tiny.safetensors": data})
    cfg = PretrainedCfg(architecture="gem_testresnet", tag="private", hf_hub_id="someone/private",
                        hf_hub_filename="tiny.safetensors", sha256=_sha(data))
    with pytest.raises(WeightsUnavailableError) as info:
        fetch_weights(cfg)
    assert "RepositoryNotFoundError" in str(info.value) and "someone/private" in str(info.value)
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    assert fetch_weights(cfg).read_bytes() == data
    assert local_hub.requests[-1][2] == "Bearer hf_test_token"


def test_hf_file_with_another_digest_is_refused(local_hub: LocalHub, weights_bytes) -> None:
    data, _ = weights_bytes
    local_hub.commit(REPO, {"tiny.safetensors": data})
    cfg = PretrainedCfg(architecture="gem_testresnet", tag="hfbad", hf_hub_id=REPO, hf_hub_filename="tiny.safetensors",
                        sha256="3" * 64)
    with pytest.raises(ChecksumMismatchError, match="blobs"):  # names the cache blob to delete
        fetch_weights(cfg)


def test_hf_offline_without_a_cached_copy_says_what_to_place_where(local_hub: LocalHub, online: dict[str, Path],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGGZOO_OFFLINE", "1")
    cfg = PretrainedCfg(architecture="gem_testresnet", tag="hfoff", hf_hub_id=REPO, hf_hub_filename="w.safetensors",
                        sha256="4" * 64)
    with pytest.raises(WeightsUnavailableError) as info:
        fetch_weights(cfg)
    message = str(info.value)
    assert f"Download:  {local_hub.url}/{REPO}/resolve/main/w.safetensors" in message
    assert f"Place at:  {online['cache'] / 'gem_testresnet.hfoff' / 'w.safetensors'} (sha256 {'4' * 64})" in message
    assert local_hub.requests == []


def test_hf_source_falls_back_to_the_url(local_hub: LocalHub, weights_bytes, tmp_path: Path) -> None:
    """An upstream file named on the Hub and as a release URL: a Hub miss is not the end."""
    data, _ = weights_bytes
    (tmp_path / "tiny.safetensors").write_bytes(data)
    with serve_folder(tmp_path) as (url, requests):
        cfg = PretrainedCfg(architecture="gem_testresnet", tag="both", hf_hub_id="someone/missing",
                            hf_hub_filename="tiny.safetensors", url=f"{url}/tiny.safetensors", sha256=_sha(data))
        assert fetch_weights(cfg).read_bytes() == data
        assert requests == ["/tiny.safetensors"]
