"""Shipped weights (weights/manifest.json): every entry loads offline, round trips, and reproduces
its recorded metric on the data it was measured on. Parametrised over the manifest, so it tests
whatever is shipped; an empty manifest is reported as a skip, never as a pass.

Also: the regeneration command (``python -m aggzoo.cli.manifest add``) on a stand-in training run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hub_helpers import images
from shared_paths import SHARED_DATA

import aggzoo
from aggzoo.cli.manifest import add_entry
from aggzoo.errors import ManifestError
from aggzoo.hub import manifest, registry
from aggzoo.hub.checkpoint import SPEC_KEY, sha256_of
from aggzoo.hub.loading import load_pretrained

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "weights" / "manifest.json"
ENTRIES = manifest.read_manifest(MANIFEST)
NOTHING_SHIPPED = pytest.param(None, marks=pytest.mark.skip(reason="weights/manifest.json lists no shipped weights yet"))
PARAMS = [pytest.param(e, id=e.name) for e in ENTRIES] or [NOTHING_SHIPPED]


def test_manifest_parses_and_every_file_is_there() -> None:
    assert MANIFEST.is_file(), "weights/manifest.json is missing"
    data = json.loads(MANIFEST.read_text())
    assert data["format"] == manifest.MANIFEST_FORMAT and isinstance(data["entries"], list)
    registered = set(aggzoo.list_pretrained())
    for entry in ENTRIES:
        path = MANIFEST.parent / entry.file
        assert path.is_file(), f"{entry.name}: {entry.file} is listed but missing"
        assert sha256_of(path) == entry.sha256, f"{entry.name}: {entry.file} does not match its sha256"
        assert entry.name in registered
        assert entry.metrics and entry.recipe, f"{entry.name}: record the recipe and the metrics it reaches"


@pytest.mark.parametrize("entry", PARAMS)
def test_shipped_weights_load_offline_and_round_trip(entry: manifest.ManifestEntry, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGGZOO_OFFLINE", "1")
    model = aggzoo.create_model(entry.name, pretrained=True)
    assert model.out_dim == entry.out_dim
    x = images(2, tuple(entry.input_size[1:]))
    with torch.no_grad():
        reference = model(x)
    folder = aggzoo.save_pretrained(model, tmp_path / "saved")
    hub_model = torch.hub.load(str(REPO), entry.name, source="local", trust_repo=True, pretrained=True)
    with torch.no_grad():
        torch.testing.assert_close(aggzoo.create_model(f"local-dir:{folder}")(x), reference, rtol=0, atol=0)
        torch.testing.assert_close(hub_model(x), reference, rtol=0, atol=0)


def _retrieval_set(evaluation: dict):
    from aggzoo.data.vg import load_vg

    if evaluation["dataset"] == "nordland_mini":
        root = SHARED_DATA / "nordland_mini" / "vg"
        if not root.is_dir():
            pytest.skip(f"{root} not found (team test data: beside the team's checkout, or set AGGZOO_SHARED_DATA)")
    else:
        from aggzoo.data.synthetic import SyntheticCityConfig, ensure_synthetic_city

        root = ensure_synthetic_city(config=SyntheticCityConfig(**evaluation.get("synthetic", {}))) / "vg"
    return load_vg(root, split=evaluation.get("split", "test"), positive_radius_m=25.0)


@pytest.mark.slow  # the evaluation pipeline on the real benchmark each entry names (1292 + 1292 images)
@pytest.mark.parametrize("entry", PARAMS)
def test_shipped_weights_reproduce_their_metric(entry: manifest.ManifestEntry) -> None:
    from aggzoo.data.transforms import eval_transform
    from aggzoo.evaluation.loop import evaluate_retrieval
    from aggzoo.evaluation.options import EvaluationOptions

    evaluation = dict(entry.evaluation)
    assert evaluation, f"{entry.name}: the manifest does not say where its metrics were measured"
    recorded = {k.rpartition("/R@")[2]: v for k, v in entry.metrics.items() if "/R@" in k}
    model = aggzoo.create_model(entry.name, pretrained=True)
    size = evaluation.get("image_size", list(entry.input_size[1:]))
    transform = eval_transform(size, mean=entry.mean, std=entry.std, interpolation=entry.interpolation)
    result = evaluate_retrieval(model, _retrieval_set(evaluation), transform,
                                EvaluationOptions(ks=tuple(int(k) for k in recorded)))
    for k, value in recorded.items():
        measured = 100.0 * result.recalls[int(k)]  # fractions -> the manifest's percent
        assert abs(measured - value) <= evaluation.get("tolerance", 0.5), f"{entry.name}: R@{k} {measured:.2f} vs {value}"


def test_add_command_writes_a_delta_that_reloads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The regeneration path on a stand-in run: a pipeline checkpoint of gem_efficientnet_lite0
    whose head and one trainable backbone stage changed."""
    name = "gem_efficientnet_lite0.test_run"
    torch.manual_seed(0)
    trained = aggzoo.create_model("gem_efficientnet_lite0", pretrained_backbone=True)
    with torch.no_grad():
        trained.head.pool.p.fill_(3.3)
        for param in trained.backbone.model.blocks[4].parameters():
            param.mul_(1.01)
    spec = dict(trained.aggzoo_spec)
    checkpoint = tmp_path / "best.ckpt"
    torch.save({"state_dict": {f"model.{k}": v for k, v in trained.state_dict().items()}, "epoch": 3,
                SPEC_KEY: spec}, checkpoint)
    folder = tmp_path / "weights"
    entry = add_entry(name, checkpoint, recipe="python train.py experiment=x", metrics={"nordland_mini/R@1": 1.5},
                               evaluation={"dataset": "nordland_mini", "image_size": [112, 224]}, directory=folder)
    stored = set(__import__("safetensors.torch", fromlist=["load_file"]).load_file(str(folder / entry.file)))
    assert {k for k in stored if k.startswith("head.")} == {k for k in trained.state_dict() if k.startswith("head.")}
    backbone_keys = {k for k in stored if k.startswith("backbone.")}
    assert backbone_keys and all(k.startswith("backbone.model.blocks.4.") for k in backbone_keys)
    assert manifest.read_manifest(folder / "manifest.json") == [entry]
    assert entry.input_size == (3, 112, 224) and entry.mean == (0.5, 0.5, 0.5)  # the backbone's own normalisation
    # The entry loads back into the registered architecture (as a shipped file would).
    monkeypatch.setenv("AGGZOO_WEIGHTS_DIR", str(folder))
    cfg = entry.to_pretrained_cfg().with_names("gem_efficientnet_lite0", "test_run")
    loaded = aggzoo.create_model("gem_efficientnet_lite0", pretrained_backbone=True)
    load_pretrained(loaded, cfg)
    loaded.eval(), trained.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(images(2, (112, 224))), trained(images(2, (112, 224))), rtol=0, atol=0)
    # Another frozen_stages is a training choice, not another model: the same tensors ship the same tensors.
    from safetensors.torch import load_file
    shipped = load_file(str(folder / entry.file))
    frozen = {**spec, "backbone": {**spec["backbone"], "frozen_stages": 4}}
    torch.save({"state_dict": {f"model.{k}": v for k, v in trained.state_dict().items()}, SPEC_KEY: frozen}, checkpoint)
    add_entry(name, checkpoint, recipe="x", metrics={}, directory=folder)
    again = load_file(str(folder / entry.file))
    assert again.keys() == shipped.keys() and all(torch.equal(again[k], shipped[k]) for k in shipped)
    # A checkpoint trained with another configuration is refused.
    spec["head"] = {**spec["head"], "p": 4.0}
    torch.save({"state_dict": {f"model.{k}": v for k, v in trained.state_dict().items()}, SPEC_KEY: spec}, checkpoint)
    with pytest.raises(ManifestError, match="registered architecture"):
        add_entry(name, checkpoint, recipe="x", metrics={}, directory=folder)
    assert name not in registry.list_pretrained()


def test_pipeline_checkpoint_files_rebuild_themselves(tmp_path: Path) -> None:
    """create_model(<checkpoint path>) reads the model config the pipeline stores beside the weights."""
    torch.manual_seed(0)
    model = aggzoo.create_model("netvlad_efficientnet_lite0", num_clusters=4)
    checkpoint = tmp_path / "last.ckpt"
    pipeline_spec = {"backbone": dict(model.aggzoo_spec["backbone"], pretrained=True),
                     "head": dict(model.aggzoo_spec["head"], _partial_=True)}
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}, SPEC_KEY: pipeline_spec},
               checkpoint)
    model.eval()
    x = images(2, (64, 128))
    with torch.no_grad():
        torch.testing.assert_close(aggzoo.create_model(str(checkpoint))(x), model(x), rtol=0, atol=0)
        folder = aggzoo.save_pretrained(model, tmp_path / "saved")
        torch.testing.assert_close(aggzoo.create_model(str(folder / "model.safetensors"))(x), model(x), rtol=0, atol=0)
