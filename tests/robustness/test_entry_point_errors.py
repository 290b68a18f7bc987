"""What a user sees when they get something wrong, through the real entry points: exit status 2,
exactly one ``error:`` line on stderr that names the key or file and the fix, and no traceback.

Each case runs ``python train.py`` / ``python eval.py`` as a user does (Hydra composition included) on
the tiny synthetic city; most stop in the config check, before any data or model is built.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from entry_helpers import TINY_EVAL, TINY_TRAIN, error_line, run_entry, started_ahead

import aggzoo
from aggzoo.errors import CheckpointError, UserError, WeightsUnavailableError
from aggzoo.hub.checkpoint import SPEC_KEY

SPEC = {"backbone": {"_target_": "aggzoo.models.backbones.timm_backbone.TimmBackbone", "model_name": "test_resnet",
                     "out_indices": [3], "pretrained": False},
        "head": {"_target_": "aggzoo.models.heads.gem.GeM"}}


@pytest.fixture(scope="module")
def data_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """One ``AGGZOO_DATA`` folder for the module (the synthetic city is generated on first use)."""
    return {"AGGZOO_DATA": str(tmp_path_factory.mktemp("data"))}


@pytest.fixture(scope="module")
def broken_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Files that are not a usable checkpoint, by how they are broken."""
    root = tmp_path_factory.mktemp("broken")
    good = root / "good.ckpt"
    model = aggzoo.create_model("gem_efficientnet_lite0")
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}, SPEC_KEY: model.aggzoo_spec},
               good)
    data = good.read_bytes()
    (root / "truncated.ckpt").write_bytes(data[: len(data) // 2])
    (root / "random.ckpt").write_bytes(bytes(torch.randint(0, 256, (4096,), generator=torch.Generator().manual_seed(0),
                                                           dtype=torch.uint8).tolist()))
    (root / "empty.ckpt").write_bytes(b"")
    (root / "text.ckpt").write_text("hello, this is not a checkpoint\n")
    (root / "a_folder").mkdir()
    return {"truncated": root / "truncated.ckpt", "random": root / "random.ckpt", "empty": root / "empty.ckpt",
            "text": root / "text.ckpt", "folder": root / "a_folder", "missing": root / "missing.ckpt"}


#: what the one error line says about each broken file
BROKEN = {
    "truncated": "is truncated, corrupt or not a checkpoint",
    "random": "is truncated, corrupt or not a checkpoint",
    "empty": "is truncated, corrupt or not a checkpoint (the file is empty)",
    "text": "is truncated, corrupt or not a checkpoint",
    "folder": "is a folder, but neither a run folder (checkpoints/last.ckpt) nor a folder written by save_pretrained",
    "missing": "no such file or folder",
}


@pytest.mark.slow
@pytest.mark.parametrize(("override", "expected"), [
    ("data.places_per_batch=0", "data.places_per_batch=0 must be at least 2: each batch needs two places or more"),
    ("data.places_per_batch=-4", "data.places_per_batch=-4 must be at least 2"),
    ("eval_batch_size=-1", "eval_batch_size=-1 must be at least 1"),
    ("recall_ks=[0]", "recall_ks=[0] must be a non-empty list of k >= 1"),
    ("ckpt_path=last", "ckpt_path=last: no checkpoints/last.ckpt under"),
    ("ckpt_path=/nowhere/last.ckpt", "ckpt_path=/nowhere/last.ckpt: no such checkpoint file"),
    ("data.image_size=[1,1]", "data.image_size must be [height, width] in pixels, two integers of at least 8"),
    # [0, 0] reached albumentations (its traceback, exit 1) before the preflight (issue 25, point 7)
    ("data.image_size=[0,0]", "data.image_size must be [height, width] in pixels, two integers of at least 8"),
    ("data.eval_image_size=[0,0]", "data.eval_image_size must be [height, width] in pixels, two integers of at least 8"),
    ("data.places_per_batch=1000", "data.places_per_batch=1000 exceeds the 24 training places with enough images"),
])
def test_train_py_user_errors(override: str, expected: str, train_error_runs, request: pytest.FixtureRequest) -> None:
    line = error_line(train_error_runs[request.node.callspec.id].result())
    assert expected in line, line


@pytest.fixture(scope="module")
def train_error_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                     data_env: dict[str, str]) -> Iterator[dict]:
    yield from started_ahead(request, "test_train_py_user_errors",
                             lambda override, expected: ([*TINY_TRAIN, override], {"env": data_env}), tmp_path_factory)


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_train_py_on_a_gpu_that_is_not_there(tmp_path: Path) -> None:
    line = error_line(run_entry([*TINY_TRAIN, "trainer.accelerator=gpu"], tmp_path))
    assert "trainer.accelerator=gpu but this machine has no CUDA GPU" in line and "trainer.accelerator=cpu" in line


@pytest.mark.slow
def test_train_py_resume_of_another_model(tmp_path: Path, data_env: dict[str, str]) -> None:
    """CheckpointMismatchError: its several lines follow the one ``error:`` line, not a traceback."""
    checkpoint = tmp_path / "other.ckpt"
    torch.save({"state_dict": {"model.head.fc.weight": torch.zeros(4, 4)}, SPEC_KEY: SPEC}, checkpoint)
    result = run_entry([*TINY_TRAIN, f"ckpt_path={checkpoint}"], tmp_path, env=data_env)
    line = error_line(result)
    assert line == f"error: checkpoint {checkpoint} does not match the configured model:", line
    assert "Fix: resume with the backbone/head" in result.stderr


def _immutable(folder: Path) -> Iterator[Path]:
    """``folder`` made unwritable, even for root (``chattr +i``), or a skip where that is not possible."""
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        folder.chmod(0o555)
    elif shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode:
        pytest.skip("cannot make a folder read-only for root here (no chattr +i)")
    try:
        yield folder
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(folder)], check=False)
        else:
            folder.chmod(0o755)


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Path]:
    yield from _immutable(tmp_path / "read_only")


@pytest.mark.slow
@pytest.mark.parametrize("script", ["train.py", "eval.py"])
def test_read_only_log_folder(script: str, read_only: Path, tmp_path: Path) -> None:
    args = [*(TINY_TRAIN if script == "train.py" else TINY_EVAL), f"paths.log_dir={read_only}"]
    line = error_line(run_entry(args, tmp_path, script=script))
    assert f"cannot write the run folder {read_only}" in line and "paths.log_dir=<folder>" in line, line


@pytest.mark.slow
def test_resume_into_a_read_only_run_folder(tmp_path: Path, data_env: dict[str, str]) -> None:
    run = tmp_path / "logs" / "train" / "runs" / "old"
    (run / "checkpoints").mkdir(parents=True)
    torch.save({"state_dict": {}, SPEC_KEY: SPEC}, run / "checkpoints" / "last.ckpt")
    for _ in _immutable(run):
        line = error_line(run_entry([*TINY_TRAIN, "ckpt_path=last"], tmp_path, env=data_env))
        assert f"cannot write the run folder {run}" in line and "resume from the copy (ckpt_path=<copy>)" in line, line


@pytest.mark.slow
@pytest.mark.parametrize(("override", "expected"), [
    ("benchmark=[]", "no benchmark selected: pass benchmark=<name> or benchmark=[a,b]"),
    ("eval_batch_size=-1", "eval_batch_size=-1 must be at least 1"),
    ("recall_ks=[0]", "recall_ks=[0] must be a non-empty list of k >= 1"),
    ("ckpt_path=last", "ckpt_path=last: no checkpoints/last.ckpt under"),
    ("image_size=[1,1]", "image_size must be [height, width] in pixels, two integers of at least 8"),
    # Options that used to fail only after every descriptor was extracted:
    ("evaluation.search.index=Bogus",
     "evaluation.search.index=Bogus is not a FAISS index_factory string for 192-D descriptors"),
    ("evaluation.postprocess.whitening=/nowhere/whitening.npz",
     "evaluation.postprocess.whitening=/nowhere/whitening.npz: no such file"),
    # the flat key of earlier versions still works, moved to its node with a warning (run/evaluation_keys.py)
    ("evaluation.index=Bogus", "evaluation.search.index=Bogus is not a FAISS index_factory string for 192-D descriptors"),
])
def test_eval_py_user_errors(override: str, expected: str, eval_error_runs, request: pytest.FixtureRequest) -> None:
    result = eval_error_runs[request.node.callspec.id].result()
    line = error_line(result)
    assert expected in line, line
    if override.startswith("evaluation.index="):
        assert ("warning: evaluation.index is now evaluation.search.index; the flat key will go in a later version: "
                "write evaluation.search.index=Bogus") in result.stderr, result.stderr


@pytest.fixture(scope="module")
def eval_error_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                    data_env: dict[str, str]) -> Iterator[dict]:
    yield from started_ahead(request, "test_eval_py_user_errors", lambda override, expected: (
        [*TINY_EVAL, override], {"script": "eval.py", "env": data_env}), tmp_path_factory)


def test_evaluation_options_are_checked_before_extraction() -> None:
    from aggzoo.evaluation.options import EvaluationOptions, SearchOptions
    from aggzoo.run.preflight import evaluation_option_problems

    def problems(**search: object) -> list[str]:
        return evaluation_option_problems(EvaluationOptions(search=SearchOptions(**search)), 112)

    assert problems(index="Flat", search_params=None) == []
    assert problems(index="HNSW32", search_params="efSearch=64") == []
    (problem,) = problems(index="IVF16,PQ64")
    assert problem.startswith("evaluation.search.index=IVF16,PQ64 is not a FAISS index_factory string for 112-D "
                              "descriptors (")
    assert "faiss::" not in problem and ".cpp" not in problem
    (problem,) = problems(index="Flat", search_params="efSearch=3")
    assert problem.startswith("evaluation.search.search_params=efSearch=3 does not apply to evaluation.search.index=Flat")


@pytest.mark.slow
@pytest.mark.parametrize("kind", BROKEN)
def test_eval_py_broken_checkpoints(kind: str, broken_files: dict[str, Path], broken_checkpoint_runs,
                                    request: pytest.FixtureRequest) -> None:
    path = broken_files[kind]
    line = error_line(broken_checkpoint_runs[request.node.callspec.id].result())
    assert str(path) in line and BROKEN[kind] in line, line


@pytest.fixture(scope="module")
def broken_checkpoint_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                           broken_files: dict[str, Path]) -> Iterator[dict]:
    yield from started_ahead(request, "test_eval_py_broken_checkpoints", lambda kind: (
        [*TINY_EVAL, f"ckpt_path={broken_files[kind]}"], {"script": "eval.py"}), tmp_path_factory)


@pytest.mark.parametrize("kind", BROKEN)
def test_create_model_of_broken_files(kind: str, broken_files: dict[str, Path]) -> None:
    """The same files through the Python API: one clear UserError, never torch's retry advice."""
    path = broken_files[kind]
    expected = {"folder": (WeightsUnavailableError, "is not a folder written by aggzoo.save_pretrained"),
                "missing": (WeightsUnavailableError, "looks like a path, but there is no such file or folder")}
    error_type, text = expected.get(kind, (CheckpointError, BROKEN[kind]))
    with pytest.raises(UserError) as info:
        aggzoo.create_model(str(path))
    message = str(info.value)
    assert isinstance(info.value, error_type) and text in message and "\n" not in message, message
    assert "weights_only=False" not in message and "weights_only` set to `False" not in message


@pytest.mark.slow
@pytest.mark.parametrize(("entry", "expected"), [
    ({"name": "nosuch_arch.x", "file": "x.safetensors", "sha256": "0" * 64},
     "cannot register weights 'nosuch_arch.x': architecture 'nosuch_arch' is not registered"),
    ({"name": "gem_efficientnet_lite0.x", "file": "x.safetensors", "sha256": "00"},
     "entry 0: sha256 must be the 64 lowercase hex digits of the file"),
], ids=["unknown_architecture", "bad_sha256"])
@pytest.mark.parametrize("command", [["aggzoo.cli.models"], ["aggzoo.cli.manifest", "verify"],
                                     ["aggzoo.cli.export", "gem_efficientnet_lite0", "--format", "torchscript"]],
                         ids=["models", "manifest_verify", "export"])
def test_a_broken_weights_manifest(entry: dict, expected: str, command: list[str], tmp_path: Path) -> None:
    """The manifest is read when the hub is imported: its error still reaches the user as one line."""
    folder = tmp_path / "weights"
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"format": "aggzoo.weights-manifest/1", "entries": [entry]}))
    result = run_entry(["-m", *command], tmp_path, script=None, env={"AGGZOO_WEIGHTS_DIR": str(folder)})
    line = error_line(result)
    assert str(folder / "manifest.json") in line and expected in line, line



#: command lines Hydra cannot compose, and what their one error line must say (the choices included)
COMPOSITION = {
    ("train.py", "head=nosuch"): ["Could not find 'head/nosuch'", "Available options in 'head': a2gc, afa, ",
                                  "avgpool", "netvlad"],
    ("train.py", "trainer.nosuch=3"): ["Could not override 'trainer.nosuch'", "+trainer.nosuch=3",
                                       "the keys of trainer are:", "max_epochs"],
    ("eval.py", "nosuch_key=1"): ["Could not override 'nosuch_key'", "the keys of the top level are:", "recall_ks"],
    ("eval.py", "image_size=[1"): ["cannot parse the override 'image_size=[1'"],
    # paths Hydra reads only quoted (issue 25, point 18): the line says how to quote them
    ("eval.py", "queries=/tmp/ünï"): ["cannot parse the override 'queries=/tmp/ünï'",
                                      "quote the value for Hydra, and the whole override for the shell: "
                                      "\"queries='/tmp/ünï'\""],
    ("eval.py", "queries=/tmp/a=b"): ["\"queries='/tmp/a=b'\""],
    ("eval.py", "photos/q"): ["cannot parse the override 'photos/q'", "must be quoted twice, for the shell and for "
                              "Hydra: \"queries='/my photos/q'\""],
}


@pytest.mark.parametrize(("script", "override"), COMPOSITION)
def test_hydra_composition_errors(script: str, override: str, composition_runs, request: pytest.FixtureRequest) -> None:
    """Hydra prints these over many lines and exits 1 unless the entry point turns them into one line."""
    line = error_line(composition_runs[request.node.callspec.id].result())
    assert all(text in line for text in COMPOSITION[script, override]), line
    assert f"python {script} --help" in line and "search path" not in line.lower(), line


@pytest.fixture(scope="module")
def composition_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    yield from started_ahead(request, "test_hydra_composition_errors",
                             lambda script, override: ([override], {"script": script}), tmp_path_factory)


def test_hydra_composition_error_in_a_sweep(tmp_path: Path) -> None:
    """``-m``: the sweep's own composition fails before any job; one line, said once."""
    line = error_line(run_entry(["-m", "head=gem,nosuch"], tmp_path))
    assert "Could not find 'head/nosuch'" in line, line
    assert not list((tmp_path / "logs").rglob("run_summary.json"))  # no job ran


def test_hydra_cfg_job_and_full_error_still_work(tmp_path: Path) -> None:
    """The wrapper changes only composition errors: ``--cfg job`` prints the config as Hydra does, and a
    user who sets HYDRA_FULL_ERROR=1 gets Hydra's full traceback, exit 1."""
    composed = run_entry(["--cfg", "job", "head=gem"], tmp_path, script="eval.py")
    assert composed.returncode == 0 and "_target_: aggzoo.models.heads.gem.GeM" in composed.stdout, composed.stderr
    full = run_entry(["head=nosuch"], tmp_path, env={"HYDRA_FULL_ERROR": "1"})
    assert full.returncode == 1 and "Traceback" in full.stderr and "MissingConfigException" in full.stderr


def test_a_flat_evaluation_key_still_composes_with_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """compose_run_config (the composition of train.py / eval.py) moves the flat keys of earlier versions
    to their node, naming the new key on stderr; the node's own key is taken as it is, without a warning."""
    from hydra_helpers import compose_run_config

    cfg = compose_run_config("eval", [*TINY_EVAL, "evaluation.index=HNSW32", "evaluation.rerank_k=7"], tmp_path / "a")
    assert cfg.evaluation.search.index == "HNSW32" and cfg.evaluation.rerank.k == 7
    assert "index" not in cfg.evaluation and "rerank_k" not in cfg.evaluation
    err = capsys.readouterr().err
    assert ("warning: evaluation.index is now evaluation.search.index; the flat key will go in a later version: "
            "write evaluation.search.index=HNSW32") in err
    assert "warning: evaluation.rerank_k is now evaluation.rerank.k" in err
    cfg = compose_run_config("eval", [*TINY_EVAL, "evaluation.search.index=HNSW32"], tmp_path / "b")
    assert cfg.evaluation.search.index == "HNSW32" and "warning" not in capsys.readouterr().err
