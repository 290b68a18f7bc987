"""Safe loading: no code runs from a checkpoint, checksums are enforced, keys are reported by name,
containers are unwrapped, downloads go through the cache, offline errors say where to put files."""

from __future__ import annotations

import hashlib
import pickle
from pathlib import Path

import pytest
import torch
from hub_helpers import images, tiny_model
from safetensors.torch import save_file

from aggzoo.errors import (
    ChecksumMismatchError,
    StateDictMismatchError,
    UnsafeCheckpointError,
    WeightsUnavailableError,
)
from aggzoo.hub.cfg import PretrainedCfg
from aggzoo.hub.checkpoint import read_checkpoint, unwrap_checkpoint
from aggzoo.hub.download import fetch_weights
from aggzoo.hub.loading import load_checkpoint, load_pretrained

pytestmark = pytest.mark.usefixtures("isolated_dirs")


class _WritesMarker:
    """Unpickling this object would create ``path`` (a stand-in for arbitrary code)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.write_text, (self.path, "code ran"))


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("layout", ["raw_pickle", "torch_save", "inside_state_dict"])
def test_malicious_pickle_is_refused_without_running(tmp_path: Path, layout: str) -> None:
    marker = tmp_path / "marker.txt"
    path = tmp_path / "evil.pth"
    if layout == "raw_pickle":
        path.write_bytes(pickle.dumps(_WritesMarker(marker)))
    elif layout == "torch_save":
        torch.save(_WritesMarker(marker), path)
    else:
        torch.save({"state_dict": {"head.pool.p": torch.ones(1), "evil": _WritesMarker(marker)}}, path)
    # Sanity: plain unpickling really would run it (so the refusal below is meaningful).
    if layout == "raw_pickle":
        probe = tmp_path / "probe.txt"
        pickle.loads(pickle.dumps(_WritesMarker(probe)))
        assert probe.exists()
    with pytest.raises(UnsafeCheckpointError, match="refused"):
        read_checkpoint(path).state_dict()
    model = tiny_model()
    with pytest.raises(UnsafeCheckpointError):
        load_checkpoint(model, path)
    assert not marker.exists()


def test_wrong_checksum_is_refused_before_parsing(tmp_path: Path) -> None:
    marker = tmp_path / "marker.txt"
    path = tmp_path / "evil.pth"
    torch.save(_WritesMarker(marker), path)
    with pytest.raises(ChecksumMismatchError, match="expected 0{64}"):
        read_checkpoint(path, sha256="0" * 64).state_dict()
    assert not marker.exists()


def test_tampered_shipped_file_is_refused(isolated_dirs: dict[str, Path]) -> None:
    model = tiny_model()
    path = isolated_dirs["weights"] / "tiny.safetensors"
    save_file(dict(model.state_dict()), str(path))
    cfg = PretrainedCfg(architecture="gem_testresnet", tag="t", file=path.name, sha256=_sha(path))
    load_pretrained(tiny_model(), cfg)  # intact: loads
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # one flipped bit in the last tensor
    path.write_bytes(bytes(data))
    with pytest.raises(ChecksumMismatchError, match=str(path.name)):
        load_pretrained(tiny_model(), cfg)


def test_missing_unexpected_and_mismatched_keys_are_named(tmp_path: Path) -> None:
    model = tiny_model()
    state = dict(model.state_dict())
    state.pop("head.pool.p")
    state["head.extra.weight"] = torch.zeros(3)
    first_conv = next(k for k in state if k.endswith("conv1.weight"))
    state[first_conv] = torch.zeros(1, 1, 1, 1)
    path = tmp_path / "bad.safetensors"
    save_file(state, str(path))
    with pytest.raises(StateDictMismatchError) as info:
        load_checkpoint(tiny_model(), path)
    message = str(info.value)
    assert "head.pool.p" in message and "missing" in message
    assert "head.extra.weight" in message and "unexpected" in message
    assert first_conv in message and "(1, 1, 1, 1)" in message
    report = load_checkpoint(tiny_model(), path, strict=False)
    assert report.missing == ["head.pool.p"] and report.unexpected == ["head.extra.weight"]
    assert [m[0] for m in report.mismatched] == [first_conv]


def test_missing_batchnorm_counters_are_kept_not_errors(tmp_path: Path) -> None:
    source = tiny_model()
    state = {k: v for k, v in source.state_dict().items() if not k.endswith("num_batches_tracked")}
    path = tmp_path / "old.safetensors"
    save_file(state, str(path))
    target = tiny_model()
    report = load_checkpoint(target, path)
    assert report.ok and report.kept and all(k.endswith("num_batches_tracked") for k in report.kept)


@pytest.mark.parametrize("wrap", ["raw", "lightning", "model_state_dict", "data_parallel", "lightning_module"])
def test_containers_are_unwrapped(tmp_path: Path, wrap: str) -> None:
    source = tiny_model()
    state = dict(source.state_dict())
    if wrap == "lightning":
        obj = {"state_dict": state, "epoch": 3, "global_step": 10, "hyper_parameters": {"lr": 1e-3}}
    elif wrap == "model_state_dict":
        obj = {"model_state_dict": state, "epoch_num": 2, "best_r5": 81.5}
    elif wrap == "data_parallel":
        obj = {f"module.{k}": v for k, v in state.items()}
    elif wrap == "lightning_module":  # aggzoo's own LightningModule: self.model = VPRModel, plus a loss
        obj = {"state_dict": {**{f"model.{k}": v for k, v in state.items()}, "loss_fn.scale": torch.ones(1)}}
    else:
        obj = state
    path = tmp_path / "ckpt.pth"
    torch.save(obj, path)
    target = tiny_model()
    load_checkpoint(target, path)
    for key, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[key], value), key


def test_numpy_scalars_next_to_the_weights_are_accepted(tmp_path: Path) -> None:
    np = pytest.importorskip("numpy")
    state = dict(tiny_model().state_dict())
    path = tmp_path / "with_numpy.pth"
    torch.save({"model_state_dict": state, "best_r5": np.float64(81.5), "epoch_num": np.int64(3)}, path)
    assert set(read_checkpoint(path).state_dict()) == set(state)


def test_unwrap_rejects_non_state_dicts() -> None:
    with pytest.raises(ValueError, match="top-level keys"):
        unwrap_checkpoint({"optimizer": {"lr": 0.1}})


def test_download_from_url_is_cached_and_checked(isolated_dirs: dict[str, Path], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGGZOO_OFFLINE")
    source = tiny_model()
    remote = tmp_path / "remote" / "tiny.safetensors"
    remote.parent.mkdir()
    save_file(dict(source.state_dict()), str(remote))
    cfg = PretrainedCfg(architecture="gem_testresnet", tag="url", url=remote.as_uri(), sha256=_sha(remote))
    path = fetch_weights(cfg)
    assert path == isolated_dirs["cache"] / "gem_testresnet.url" / "tiny.safetensors"
    remote.unlink()  # second use comes from the cache
    assert fetch_weights(cfg) == path
    target = tiny_model()
    load_pretrained(target, cfg)
    assert torch.equal(target.state_dict()["head.pool.p"], source.state_dict()["head.pool.p"])


def test_download_with_wrong_checksum_leaves_nothing(isolated_dirs: dict[str, Path], tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGGZOO_OFFLINE")
    remote = tmp_path / "tiny.safetensors"
    save_file(dict(tiny_model().state_dict()), str(remote))
    cfg = PretrainedCfg(architecture="gem_testresnet", tag="bad", url=remote.as_uri(), sha256="1" * 64)
    with pytest.raises(ChecksumMismatchError):
        fetch_weights(cfg)
    assert not any((isolated_dirs["cache"] / "gem_testresnet.bad").iterdir())


def test_offline_error_names_the_url_and_the_place(isolated_dirs: dict[str, Path]) -> None:
    cfg = PretrainedCfg(architecture="salad_x", tag="official", url="https://example.org/files/dino_salad.ckpt",
                        sha256="a" * 64)
    with pytest.raises(WeightsUnavailableError) as info:
        fetch_weights(cfg)
    message = str(info.value)
    assert "https://example.org/files/dino_salad.ckpt" in message
    assert str(isolated_dirs["cache"] / "salad_x.official" / "dino_salad.ckpt") in message
    assert "a" * 64 in message


def test_manual_download_page_says_where_to_place_the_file(isolated_dirs: dict[str, Path], tmp_path: Path) -> None:
    cfg = PretrainedCfg(architecture="gem_testresnet", tag="drive", download_page="https://drive.example/f/1",
                        filename="model.ckpt")
    with pytest.raises(WeightsUnavailableError) as info:
        fetch_weights(cfg)
    target = isolated_dirs["cache"] / "gem_testresnet.drive" / "model.ckpt"
    assert "https://drive.example/f/1" in str(info.value) and str(target) in str(info.value)
    # Placing the file there is all it takes.
    target.parent.mkdir(parents=True)
    torch.save(dict(tiny_model().state_dict()), target)
    with pytest.warns(UserWarning, match="no sha256 is pinned"):
        assert fetch_weights(cfg) == target


def test_missing_shipped_file_says_so(isolated_dirs: dict[str, Path]) -> None:
    cfg = PretrainedCfg(architecture="gem_testresnet", tag="gone", file="gone.safetensors", sha256="b" * 64)
    with pytest.raises(WeightsUnavailableError, match="gone.safetensors"):
        fetch_weights(cfg)


def test_delta_contents_keep_backbone_tensors_absent_from_the_file(tmp_path: Path) -> None:
    torch.manual_seed(0)
    base = tiny_model()
    trained = tiny_model()
    trained.load_state_dict(base.state_dict())
    with torch.no_grad():
        trained.head.pool.p.fill_(4.5)
        changed = next(k for k, v in trained.named_parameters() if k.startswith("backbone") and "layer" in k)
        dict(trained.named_parameters())[changed].add_(1.0)
    delta = {k: v for k, v in trained.state_dict().items() if k.startswith("head.") or k == changed}
    path = tmp_path / "delta.safetensors"
    save_file(delta, str(path))
    target = tiny_model()
    target.load_state_dict(base.state_dict())  # stands for "built with the pretrained backbone"
    with pytest.raises(StateDictMismatchError):
        load_checkpoint(target, path)  # as a full checkpoint it is incomplete
    report = load_checkpoint(target, path, contents="delta")
    assert set(report.loaded) == set(delta) and all(k.startswith("backbone.") for k in report.kept)
    x = images()
    target.eval(), trained.eval()
    with torch.no_grad():
        torch.testing.assert_close(target(x), trained(x), rtol=0, atol=0)
