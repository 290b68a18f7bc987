"""``eval.py model=<name>`` through the real eval config and ``run.evaluate.evaluate``: every kind of name
``create_model`` takes, the protocol the weights' PretrainedCfg states (and its overrides), the published
figures beside ours, and the settings a named model would silently ignore.

Independent expectations: the same weights reached through a save_pretrained folder, ``local-dir:``,
``hf-hub:`` (an offline Hugging Face cache) and a pipeline checkpoint give the same predictions; each
evaluation equals ``evaluate_retrieval`` run directly with the transform the protocol names.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra_helpers import compose_run_config

import aggzoo
from aggzoo.cli.reporting import reported_user_errors
from aggzoo.data.transforms import eval_transform
from aggzoo.errors import CheckpointNotFoundError, ConfigError, UnknownModelError
from aggzoo.evaluation.loop import evaluate_retrieval
from aggzoo.evaluation.options import EvaluationOptions, SearchOptions
from aggzoo.evaluation.protocol import protocol_transform
from aggzoo.hub.builder import build_model
from aggzoo.hub.cfg import PretrainedCfg
from aggzoo.hub.checkpoint import SPEC_KEY
from aggzoo.models.input_size import size_multiple
from aggzoo.run.benchmark_config import load_benchmark
from aggzoo.run.evaluate import evaluate, evaluation_protocol
from aggzoo.run.model_by_name import load_model_to_evaluate, model_spec

#: the tiny synthetic city, no pictures (the grid is tested in test_unlabelled / test_report)
BASE = ["synthetic=tiny", "evaluation.outputs.pictures=false"]
#: the protocol the tiny model's cfg states: not the config's image_size, bilinear, its own mean/std
CFG = PretrainedCfg(architecture="gem_test_resnet", tag="mine", input_size=(3, 34, 40), interpolation="bilinear",
                    mean=(0.4, 0.45, 0.5), std=(0.2, 0.25, 0.3), out_dim=None,
                    metrics={"synthetic_test/R@1": 50.0, "synthetic_test/R@5": 75.0})


@pytest.fixture(scope="module")
def names(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One tiny random model (test_resnet + GeM) written as each kind of file a name can point to."""
    root = tmp_path_factory.mktemp("names")
    cfg = compose_run_config("eval", ["backbone=test_resnet"], root / "compose")
    torch.manual_seed(0)
    model = build_model(model_spec(cfg))
    with torch.no_grad():
        model.head.pool.p.fill_(2.5)  # not the initial value: the weights must come from the file
    model.eval()
    saved = aggzoo.save_pretrained(model, root / "saved", pretrained_cfg=CFG)
    # An offline Hugging Face cache: models--<owner>--<repo>/snapshots/<revision>/ and refs/main, as
    # huggingface_hub lays it out; aggzoo's own download cache points at the same snapshot.
    revision = "0123456789abcdef0123456789abcdef01234567"
    snapshot = root / "hf" / "hub" / "models--someone--tiny-gem" / "snapshots" / revision
    snapshot.parent.mkdir(parents=True)
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text(revision)
    snapshot.symlink_to(saved, target_is_directory=True)
    (root / "cache" / "hf-hub").mkdir(parents=True)
    (root / "cache" / "hf-hub" / "someone--tiny-gem").symlink_to(snapshot, target_is_directory=True)
    # A train.py checkpoint: what _ModelConfigInCheckpoint and Lightning write (model.* keys + the spec).
    checkpoint = root / "run" / "checkpoints" / "last.ckpt"
    checkpoint.parent.mkdir(parents=True)
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}, "epoch": 1,
                SPEC_KEY: model_spec(cfg)}, checkpoint)
    return {"model": model, "saved": saved, "checkpoint": checkpoint, "root": root}


@pytest.fixture()
def offline(names: dict, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    monkeypatch.setenv("AGGZOO_DATA", str(tmp_path_factory.getbasetemp() / "data"))  # the tiny city, once
    monkeypatch.setenv("AGGZOO_CACHE", str(names["root"] / "cache"))
    monkeypatch.setenv("HF_HUB_CACHE", str(names["root"] / "hf" / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("AGGZOO_OFFLINE", "1")


def _evaluate(overrides: list[str], out: Path) -> tuple[list, dict]:
    results = evaluate(compose_run_config("eval", BASE + overrides, out))
    return results, json.loads((out / "results.json").read_text())


def _direct(model: torch.nn.Module, transform, metric: str = "ip") -> object:
    """evaluate_retrieval with the transform given, on the same benchmark: the independent side."""
    cfg = compose_run_config("eval", BASE, Path("unused"))
    retrieval_set = load_benchmark(cfg.benchmark.synthetic_test)
    return evaluate_retrieval(model, retrieval_set, transform,
                              EvaluationOptions(ks=(1, 5, 10, 20), search=SearchOptions(metric=metric)))


@pytest.mark.usefixtures("offline")
def test_every_kind_of_name_gives_the_same_predictions_under_the_cfg_protocol(names: dict, tmp_path: Path) -> None:
    multiple = size_multiple(names["model"])  # 16: test_resnet's stride at out_indices [3]
    expected = _direct(names["model"], protocol_transform((34, 40), multiple=multiple, mean=CFG.mean, std=CFG.std,
                                                          interpolation="bilinear"))
    for i, name in enumerate([str(names["saved"]), f"local-dir:{names['saved']}", "hf-hub:someone/tiny-gem"]):
        results, written = _evaluate([f"model={name}"], tmp_path / str(i))
        np.testing.assert_array_equal(results[0].predictions, expected.predictions)
        assert results[0].recalls == expected.recalls
        meta = written["meta"]
        assert (meta["model"], meta["architecture"], meta["tag"]) == (name, "gem_test_resnet", "mine")
        protocol = meta["protocol"]
        # (34, 40) is snapped to (32, 48), multiples of the backbone's stride (results.json keeps the cfg's size)
        assert (protocol["image_size"], protocol["multiple"], protocol["resize"]) == ([34, 40], multiple, "protocol")
        assert protocol["interpolation"] == "bilinear"
        assert protocol["mean"] == list(CFG.mean) and protocol["descriptor_dim"] == names["model"].out_dim
        row = written["results"][0]
        assert row["published"] == {"1": 50.0, "5": 75.0}
        assert row["delta"]["1"] == pytest.approx(100 * expected.recalls[1] - 50.0, abs=0.006)


@pytest.mark.usefixtures("offline")
def test_a_train_checkpoint_by_model_or_ckpt_path_uses_the_config_protocol(names: dict, tmp_path: Path) -> None:
    """No PretrainedCfg in a pipeline checkpoint: image_size, the pipeline resize, the backbone's
    normalisation, as ``ckpt_path=`` always evaluated; a run folder resolves to its checkpoint."""
    mean, std = names["model"].backbone.model.pretrained_cfg["mean"], names["model"].backbone.model.pretrained_cfg["std"]
    expected = _direct(names["model"], eval_transform((32, 48), mean=mean, std=std))
    results, written = _evaluate([f"model={names['checkpoint']}", "image_size=[32,48]"], tmp_path)
    np.testing.assert_array_equal(results[0].predictions, expected.predictions)
    assert written["meta"]["protocol"]["resize"] == "pipeline" and written["meta"]["tag"] is None
    assert "published" not in written["results"][0]
    run_folder = names["checkpoint"].parents[1]
    by_folder = load_model_to_evaluate(compose_run_config("eval", BASE + [f"ckpt_path={run_folder}"], tmp_path))
    assert by_folder.pretrained_cfg is None
    for key, value in names["model"].state_dict().items():
        torch.testing.assert_close(by_folder.model.state_dict()[key], value, rtol=0, atol=0)


@pytest.mark.usefixtures("offline")
def test_registered_tag_loads_its_weights_and_its_protocol(tmp_path: Path) -> None:
    """The shipped synthetic weights, by name: their cfg's protocol (the pipeline resize at 120 x 160,
    mean/std 0.5) and their published synthetic_test figures, with one field overridden here (the
    size, to keep the test small); ``ckpt_path=<name>`` loads the same weights (it loaded none before)."""
    name = "netvlad_efficientnet_lite0.synthetic"
    cfg = aggzoo.list_pretrained(name, with_cfg=True)[0]
    model = aggzoo.create_model(name, pretrained=True)
    expected = _direct(model, eval_transform((32, 64), mean=cfg.mean, std=cfg.std))
    results, written = _evaluate([f"model={name}", "evaluation.protocol.image_size=[32,64]"], tmp_path)
    np.testing.assert_array_equal(results[0].predictions, expected.predictions)
    meta = written["meta"]
    assert (meta["model"], meta["tag"], meta["weights"]) == (name, "synthetic", f"weights/{cfg.file}")
    assert meta["protocol"]["image_size"] == [32, 64] and meta["protocol"]["overridden"] == ["image_size"]
    assert (meta["protocol"]["resize"], meta["protocol"]["mean"]) == ("pipeline", [0.5, 0.5, 0.5])  # the cfg's
    assert written["results"][0]["published"]["1"] == cfg.metrics["synthetic_test/R@1"]
    assert written["results"][0]["delta"]["1"] == round(100 * expected.recalls[1] - cfg.metrics["synthetic_test/R@1"], 2)
    by_ckpt_path = load_model_to_evaluate(compose_run_config("eval", BASE + [f"ckpt_path={name}"], tmp_path))
    assert by_ckpt_path.tag == "synthetic"
    for key, value in model.state_dict().items():
        torch.testing.assert_close(by_ckpt_path.model.state_dict()[key], value, rtol=0, atol=0)


@pytest.mark.usefixtures("offline")
def test_weights_whose_cfg_states_the_l2_metric_are_searched_by_l2(tmp_path: Path) -> None:
    """GeM with l2=before_pool (not unit-norm, the dVGL benchmark's variant) saved with a cfg stating
    eval_metric="l2": ``model=<folder>`` searches by L2 distance (the override: test_search_metric)."""
    cfg = compose_run_config("eval", ["backbone=test_resnet", "+head.l2=before_pool"], tmp_path / "compose")
    torch.manual_seed(1)
    model = build_model(model_spec(cfg)).eval()
    saved = aggzoo.save_pretrained(model, tmp_path / "saved", pretrained_cfg=replace(CFG, eval_metric="l2"))
    transform = protocol_transform((34, 40), multiple=size_multiple(model), mean=CFG.mean, std=CFG.std,
                                   interpolation="bilinear")
    results, written = _evaluate([f"model={saved}"], tmp_path / "out")
    np.testing.assert_array_equal(results[0].predictions, _direct(model, transform, "l2").predictions)
    assert written["meta"]["protocol"]["metric"] == written["meta"]["settings"]["metric"] == "l2"


@pytest.mark.usefixtures("offline")
def test_protocol_overrides_short_side_and_command_line_image_size(names: dict, tmp_path: Path) -> None:
    model = names["model"]
    short = protocol_transform(short_side=32, multiple=size_multiple(model), mean=CFG.mean, std=CFG.std, interpolation="bicubic")
    expected = _direct(model, short)
    results, written = _evaluate([f"model={names['saved']}", "evaluation.protocol.image_size=32",
                                  "evaluation.protocol.interpolation=bicubic"], tmp_path / "short")
    np.testing.assert_array_equal(results[0].predictions, expected.predictions)
    assert written["meta"]["protocol"]["short_side"] and written["meta"]["protocol"]["image_size"] == 32
    # image_size= on the command line sets a named model's size too (it is not silently ignored)
    cfg = compose_run_config("eval", BASE + [f"model={names['saved']}", "image_size=[40,60]"], tmp_path / "top")
    protocol = evaluation_protocol(model, cfg, CFG, {"mean": (0, 0, 0), "std": (1, 1, 1)})
    assert protocol.image_size == (40, 60) and protocol.mean == CFG.mean and protocol.overridden == ("image_size",)
    with pytest.raises(ConfigError, match="short side.*protocol.resize=true"):
        _evaluate([f"model={names['saved']}", "evaluation.protocol.image_size=32",
                   "evaluation.protocol.resize=false"],
                  tmp_path / "bad")
    with pytest.raises(ConfigError, match="evaluation.protocol.descriptor_dim"):
        _evaluate([f"model={names['saved']}", "evaluation.protocol.descriptor_dim=12"], tmp_path / "dim")


@pytest.mark.usefixtures("offline")
@pytest.mark.parametrize("given", ["ckpt_path", "model"])
@pytest.mark.parametrize("override", [["head=netvlad"], ["backbone=resnet50", "+head.p=4"]])
def test_head_or_backbone_beside_a_named_model_is_refused(names: dict, tmp_path: Path, given: str,
                                                         override: list[str]) -> None:
    """Issue 14 item 6: the file carries its architecture, so these would be ignored silently."""
    with pytest.raises(ConfigError) as info:
        evaluate(compose_run_config("eval", BASE + [f"{given}={names['checkpoint']}", *override], tmp_path))
    message = str(info.value)
    assert f"{given}={names['checkpoint']}" in message
    assert all(o.lstrip("+").split("=")[0] in message for o in override) and "would be ignored" in message


@pytest.mark.usefixtures("offline")
def test_bad_names_are_user_errors(names: dict, tmp_path: Path) -> None:
    cases = [(["model=netvlad_efficientnet_lite0.synthtic"], UnknownModelError, "Did you mean"),
             (["model=no_such_model"], UnknownModelError, "python -m aggzoo.cli.models"),
             ([f"model={tmp_path / 'missing.ckpt'}"], CheckpointNotFoundError, "no such file"),
             ([f"model={names['root']}"], CheckpointNotFoundError, "neither a run folder"),
             ([f"model=local-dir:{names['saved']}", f"ckpt_path={names['checkpoint']}"], ConfigError, "two models")]
    for overrides, error, text in cases:
        with pytest.raises(error, match=text):
            evaluate(compose_run_config("eval", BASE + overrides, tmp_path))


@pytest.mark.usefixtures("offline")
def test_a_bad_name_is_one_error_line_and_exit_status_2(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    """What eval.py wraps evaluate in (cli/reporting.reported_user_errors), in-process: one line, status 2."""
    cfg = compose_run_config("eval", BASE + ["model=netvlad_efficientnet_lite0.synthtic"], tmp_path)
    with pytest.raises(SystemExit) as info, reported_user_errors():
        evaluate(cfg)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert info.value.code == 2 and len(lines) == 1
    assert "model=netvlad_efficientnet_lite0.synthtic" in lines[0] and "netvlad_efficientnet_lite0.synthetic" in lines[0]
