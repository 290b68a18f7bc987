"""Stored data is never code: every entry point that turns a file into a model refuses a spec that
names anything but aggzoo's own backbone and head classes, before importing or calling it.

The original hole: a ``.ckpt`` whose stored backbone config was ``{_target_: shutil.copyfile,
_args_: [a, b]}`` copied the file when loaded. Each test below hands one entry point a file (a
Lightning-style checkpoint, a ``save_pretrained`` folder, a shipped-weights manifest) whose spec names
a stdlib callable that would write a file, and checks that it is refused, names the target, and that
the file was not written.

``create_model("<architecture>", checkpoint_path=<file>)`` builds from aggzoo's own registered code
and does not need the file's spec, but the one reader validates every recorded spec as it reads: a file
naming foreign code is refused there too rather than loaded with its spec ignored (a file that lies
about one thing is not trusted for its tensors either).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from entry_helpers import REPO, TINY_EVAL, TINY_TRAIN, error_line, run_entry
from safetensors.torch import save_file

import aggzoo
from aggzoo.errors import UnsafeSpecError
from aggzoo.hub.checkpoint import SPEC_KEY
from aggzoo.models.backbones.timm_backbone import TimmBackbone
from aggzoo.models.heads.gem import GeM
from aggzoo.models.vpr_model import VPRModel

BACKBONE = {"_target_": "aggzoo.models.backbones.timm_backbone.TimmBackbone", "model_name": "test_resnet",
            "out_indices": [3], "pretrained": False}
HEAD = {"_target_": "aggzoo.models.heads.gem.GeM", "p": 3.0, "eps": 1e-6, "learn_p": True}


def _state_dict() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return VPRModel(TimmBackbone("test_resnet", out_indices=(3,)), GeM).state_dict()


def copyfile_spec(src: Path, dst: Path) -> dict[str, Any]:
    """The original hole: the backbone "config" is ``shutil.copyfile(src, dst)``."""
    return {"backbone": {"_target_": "shutil.copyfile", "_args_": [str(src), str(dst)]}, "head": dict(HEAD)}


def write_text_spec(src: Path, dst: Path) -> dict[str, Any]:
    """A valid backbone, and a head "config" that is ``pathlib.Path.write_text`` with keyword arguments."""
    return {"backbone": dict(BACKBONE), "head": {"_target_": "pathlib.Path.write_text", "self": str(dst), "data": "x"}}


def system_spec(src: Path, dst: Path) -> dict[str, Any]:
    return {"backbone": dict(BACKBONE), "head": {"_target_": "os.system", "command": f"cp {src} {dst}"}}


def nested_spec(src: Path, dst: Path) -> dict[str, Any]:
    """An allowed head whose argument is itself a ``_target_`` node (Hydra would build it first)."""
    return {"backbone": dict(BACKBONE),
            "head": dict(HEAD, p={"_target_": "shutil.copyfile", "_args_": [str(src), str(dst)]})}


SPECS: dict[str, tuple[Callable[[Path, Path], dict[str, Any]], str]] = {
    # name: (spec maker, what the refusal names)
    "copyfile": (copyfile_spec, "shutil.copyfile"),
    "write_text": (write_text_spec, "pathlib.Path.write_text"),
    "os_system": (system_spec, "os.system"),
    "nested": (nested_spec, "nested '_target_'"),
}


@pytest.fixture
def paths(tmp_path: Path) -> dict[str, Path]:
    """``src``: a file the hostile spec would copy; ``dst``: where it would land (must stay absent)."""
    src = tmp_path / "secret.txt"
    src.write_text("do not copy me")
    return {"src": src, "dst": tmp_path / "pwned.txt", "tmp": tmp_path}


def crafted_checkpoint(path: Path, spec: dict[str, Any]) -> Path:
    """A Lightning-style checkpoint of train.py: real tensors, the hostile spec as its model config."""
    torch.save({"state_dict": {f"model.{k}": v for k, v in _state_dict().items()}, "epoch": 0, "global_step": 1,
                SPEC_KEY: spec}, path)
    return path


def crafted_folder(folder: Path, spec: dict[str, Any], *, in_metadata: bool = False) -> Path:
    """A ``save_pretrained`` folder whose config.json names ``spec`` (or, with ``in_metadata``, whose
    config.json is clean and whose safetensors metadata names it)."""
    folder.mkdir(parents=True, exist_ok=True)
    clean = {"backbone": dict(BACKBONE), "head": dict(HEAD)}
    config = {"format": "aggzoo.save_pretrained/1", "architecture": None, "spec": clean if in_metadata else spec,
              "out_dim": 192, "pretrained_cfg": None}
    (folder / "config.json").write_text(json.dumps(config))
    save_file(_state_dict(), str(folder / "model.safetensors"), metadata={SPEC_KEY: json.dumps(spec)})
    return folder


def _assert_refused(error: BaseException, target: str, dst: Path) -> None:
    assert target in str(error), str(error)
    assert not dst.exists()


def test_the_saved_folder_format_is_the_one_create_model_reads(tmp_path: Path) -> None:
    """The crafted folders below differ from a real one only in their spec."""
    folder = crafted_folder(tmp_path / "ok", {"backbone": dict(BACKBONE), "head": dict(HEAD)})
    assert json.loads((folder / "config.json").read_text())["format"] == json.loads(
        (aggzoo.save_pretrained(aggzoo.create_model(str(folder)), tmp_path / "real") / "config.json").read_text())["format"]


# -- Python APIs -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", SPECS)
def test_create_model_of_a_checkpoint_file(kind: str, paths: dict[str, Path]) -> None:
    make, target = SPECS[kind]
    checkpoint = crafted_checkpoint(paths["tmp"] / "last.ckpt", make(paths["src"], paths["dst"]))
    with pytest.raises(UnsafeSpecError) as info:
        aggzoo.create_model(str(checkpoint))
    _assert_refused(info.value, target, paths["dst"])


@pytest.mark.parametrize("in_metadata", [False, True], ids=["config_json", "safetensors_metadata"])
@pytest.mark.parametrize("kind", ["copyfile", "write_text"])
def test_create_model_of_a_local_dir(kind: str, in_metadata: bool, paths: dict[str, Path]) -> None:
    make, target = SPECS[kind]
    folder = crafted_folder(paths["tmp"] / "saved", make(paths["src"], paths["dst"]), in_metadata=in_metadata)
    for name in (f"local-dir:{folder}", str(folder), str(folder / "model.safetensors")):
        with pytest.raises(UnsafeSpecError) as info:
            aggzoo.create_model(name)
        _assert_refused(info.value, target, paths["dst"])


def test_create_model_of_hf_hub(paths: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """An ``hf-hub:`` repository already in the download cache (no network here) is read as a local dir."""
    cache = paths["tmp"] / "cache"
    monkeypatch.setenv("AGGZOO_CACHE", str(cache))
    monkeypatch.setenv("AGGZOO_OFFLINE", "1")
    crafted_folder(cache / "hf-hub" / "someone--hostile", copyfile_spec(paths["src"], paths["dst"]))
    with pytest.raises(UnsafeSpecError) as info:
        aggzoo.create_model("hf-hub:someone/hostile")
    _assert_refused(info.value, "shutil.copyfile", paths["dst"])


@pytest.mark.parametrize("kind", ["copyfile", "os_system"])
def test_create_model_of_a_name_with_a_crafted_checkpoint_path(kind: str, paths: dict[str, Path]) -> None:
    """A registered name builds from aggzoo's code; the file it is given is still read by the one
    reader, which refuses a file recording foreign code instead of loading its tensors."""
    make, target = SPECS[kind]
    checkpoint = crafted_checkpoint(paths["tmp"] / "last.ckpt", make(paths["src"], paths["dst"]))
    with pytest.raises(UnsafeSpecError) as info:
        aggzoo.create_model("gem_efficientnet_lite0", checkpoint_path=checkpoint)
    _assert_refused(info.value, target, paths["dst"])


def test_torch_hub_load(paths: dict[str, Path]) -> None:
    checkpoint = crafted_checkpoint(paths["tmp"] / "last.ckpt", copyfile_spec(paths["src"], paths["dst"]))
    with pytest.raises(UnsafeSpecError) as info:
        torch.hub.load(str(REPO), "gem_efficientnet_lite0", source="local", checkpoint_path=checkpoint)
    _assert_refused(info.value, "shutil.copyfile", paths["dst"])


def test_resume_check_refuses_before_lightning_reads_the_file(paths: dict[str, Path]) -> None:
    from aggzoo.training.checkpointing import check_checkpoint_matches

    checkpoint = crafted_checkpoint(paths["tmp"] / "last.ckpt", copyfile_spec(paths["src"], paths["dst"]))
    module = torch.nn.Module()
    module.model = VPRModel(TimmBackbone("test_resnet", out_indices=(3,)), GeM)
    with pytest.raises(UnsafeSpecError) as info:
        check_checkpoint_matches(checkpoint, module, {"backbone": BACKBONE, "head": HEAD})
    _assert_refused(info.value, "shutil.copyfile", paths["dst"])


# -- command lines -------------------------------------------------------------------------------------


def _cli_refused(result: Any, target: str, dst: Path) -> None:
    line = error_line(result)
    assert target in line and "refusing to build" in line, line
    assert not dst.exists()


@pytest.mark.slow
def test_eval_py(paths: dict[str, Path]) -> None:
    checkpoint = crafted_checkpoint(paths["tmp"] / "last.ckpt", copyfile_spec(paths["src"], paths["dst"]))
    result = run_entry([*TINY_EVAL, f"ckpt_path={checkpoint}"], paths["tmp"], script="eval.py")
    _cli_refused(result, "shutil.copyfile", paths["dst"])


@pytest.mark.slow
def test_train_py_resume(paths: dict[str, Path]) -> None:
    """``train.py ckpt_path=<file>``: refused by the safe read before anything is built or trained."""
    run = paths["tmp"] / "logs" / "train" / "runs" / "old"
    (run / "checkpoints").mkdir(parents=True)
    checkpoint = crafted_checkpoint(run / "checkpoints" / "last.ckpt", write_text_spec(paths["src"], paths["dst"]))
    for ckpt_path in (str(checkpoint), "last"):
        result = run_entry([*TINY_TRAIN, f"ckpt_path={ckpt_path}"], paths["tmp"])
        _cli_refused(result, "pathlib.Path.write_text", paths["dst"])
    assert sorted(p.name for p in run.rglob("*")) == ["checkpoints", "last.ckpt"]  # the run folder untouched


@pytest.mark.slow
def test_export_cli(paths: dict[str, Path]) -> None:
    checkpoint = crafted_checkpoint(paths["tmp"] / "last.ckpt", copyfile_spec(paths["src"], paths["dst"]))
    output = paths["tmp"] / "model.pt"
    result = run_entry(["-m", "aggzoo.cli.export", str(checkpoint), "--format", "torchscript", "--output", str(output)],
                       paths["tmp"], script=None)
    _cli_refused(result, "shutil.copyfile", paths["dst"])
    assert not output.exists()


def _manifest(folder: Path, name: str, weights: Path) -> None:
    entry = {"name": name, "file": weights.name, "sha256": hashlib.sha256(weights.read_bytes()).hexdigest(),
             "contents": "full", "input_size": [3, 64, 64]}
    (folder / "manifest.json").write_text(json.dumps({"format": "aggzoo.weights-manifest/1", "entries": [entry]}))


@pytest.mark.slow
def test_manifest_verify(paths: dict[str, Path]) -> None:
    """A weights folder whose (correctly hashed) entry file records a hostile spec in its metadata."""
    folder = paths["tmp"] / "weights"
    folder.mkdir()
    weights = folder / "gem_efficientnet_lite0.crafted.safetensors"
    save_file(aggzoo.create_model("gem_efficientnet_lite0").state_dict(), str(weights),
              metadata={SPEC_KEY: json.dumps(copyfile_spec(paths["src"], paths["dst"]))})
    _manifest(folder, "gem_efficientnet_lite0.crafted", weights)
    result = run_entry(["-m", "aggzoo.cli.manifest", "verify"], paths["tmp"], script=None,
                       env={"AGGZOO_WEIGHTS_DIR": str(folder)})
    _cli_refused(result, "shutil.copyfile", paths["dst"])


@pytest.mark.slow
def test_manifest_add(paths: dict[str, Path]) -> None:
    folder = paths["tmp"] / "weights"
    checkpoint = crafted_checkpoint(paths["tmp"] / "best.ckpt", system_spec(paths["src"], paths["dst"]))
    result = run_entry(["-m", "aggzoo.cli.manifest", "add", "gem_efficientnet_lite0.crafted", str(checkpoint),
                        "--recipe", "x", "--metrics", "{}", "--contents", "full"], paths["tmp"], script=None,
                       env={"AGGZOO_WEIGHTS_DIR": str(folder)})
    _cli_refused(result, "os.system", paths["dst"])
    assert not list(folder.glob("*"))  # nothing written to the weights folder


def test_manifest_model_kwargs_cannot_name_a_target(paths: dict[str, Path]) -> None:
    """A manifest entry's ``model_kwargs`` reach the entry point's spec, and the builder's allowlist."""
    import aggzoo.hub.factory  # (fills the registry)
    from aggzoo.hub import registry
    from aggzoo.hub.cfg import PretrainedCfg

    hostile = {"backbone_kwargs": {"_target_": "shutil.copyfile", "_args_": [str(paths["src"]), str(paths["dst"])]}}
    name = "gem_efficientnet_lite0.hostile_kwargs"
    registry.register_pretrained(name, PretrainedCfg(file="x.safetensors", sha256="0" * 64, model_kwargs=hostile))
    try:
        with pytest.raises(UnsafeSpecError) as info:
            aggzoo.create_model(name)  # a tag selects its model_kwargs even without pretrained=True
        _assert_refused(info.value, "shutil.copyfile", paths["dst"])
    finally:
        registry._PRETRAINED["gem_efficientnet_lite0"].pop("hostile_kwargs", None)


class _CopiesOnLoad:
    """Pickles as ``shutil.copyfile(src, dst)``: what a crafted ground-truth ``.npy`` would run."""

    def __init__(self, src: Path, dst: Path) -> None:
        self.src, self.dst = str(src), str(dst)

    def __reduce__(self) -> tuple:
        import shutil

        return shutil.copyfile, (self.src, self.dst)


def test_ground_truth_npy_files_never_run_code(paths: dict[str, Path]) -> None:
    """Benchmark ground truth (VPR-Bench, MSLS / Pittsburgh lists) is ragged, so it is an object
    array; it is unpickled with numpy's array types only."""
    import numpy as np
    from PIL import Image

    from aggzoo.data.layout import load_npy
    from aggzoo.data.vpr_bench import load_vpr_bench
    from aggzoo.errors import DatasetFormatError

    root = paths["tmp"] / "SPED"
    for part in ("ref", "query"):
        (root / part).mkdir(parents=True)
        Image.new("RGB", (4, 4)).save(root / part / "0.jpg")
    rows = np.empty((1, 2), dtype=object)
    rows[0] = [0, _CopiesOnLoad(paths["src"], paths["dst"])]
    np.save(root / "ground_truth_new.npy", rows, allow_pickle=True)
    with pytest.raises(DatasetFormatError, match="refusing the global shutil.copyfile"):
        load_vpr_bench(root)
    assert not paths["dst"].exists()
    rows[0] = [0, [0]]  # the honest file loads
    np.save(root / "ground_truth_new.npy", rows, allow_pickle=True)
    assert [p.tolist() for p in load_vpr_bench(root).positives] == [[0]]
    np.save(paths["tmp"] / "list.npy", np.array(["a.jpg"], dtype=object), allow_pickle=True)
    with pytest.raises(DatasetFormatError, match="holds Python objects"):
        load_npy(paths["tmp"] / "list.npy")  # a list of paths holds no objects
