"""The registry and create_model: every registered name builds, names resolve (or get close
matches), tags carry their variants, specs only build aggzoo modules, save_pretrained round trips,
load_head checks channels."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hub_helpers import TINY_NAME, images, tiny_model
from omegaconf import OmegaConf
from safetensors.torch import save_file

import aggzoo
from aggzoo.cli.models import pretrained_table
from aggzoo.errors import (
    ConfigError,
    StateDictMismatchError,
    UnknownModelError,
    UnsafeSpecError,
    WeightsUnavailableError,
)
from aggzoo.hub import builder, registry
from aggzoo.hub.cfg import PretrainedCfg
from aggzoo.zoo import _backbones as _specs

REPO = Path(__file__).resolve().parents[2]
ARCHITECTURES = aggzoo.list_models()
TAGS = aggzoo.list_pretrained()


def _meta(name: str, **kwargs) -> torch.nn.Module:
    with torch.device("meta"):
        return aggzoo.create_model(name, **kwargs)


def test_public_api_is_exported_and_import_is_light() -> None:
    assert set(aggzoo.__all__) >= {"create_model", "list_models", "list_pretrained", "load_head", "save_pretrained"}
    heavy = ["lightning", "pytorch_lightning", "hydra", "omegaconf", "faiss", "albumentations", "cv2"]
    code = f"import sys, aggzoo; print([m for m in {heavy!r} if m in sys.modules])"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", f"import aggzoo pulled in {result.stdout.strip()}"


def test_listing_is_sorted_and_filters() -> None:
    assert ARCHITECTURES == sorted(ARCHITECTURES) and len(set(ARCHITECTURES)) == len(ARCHITECTURES)
    assert aggzoo.list_models("*_dinov2_vitb14") == [n for n in ARCHITECTURES if n.endswith("_dinov2_vitb14")]
    with_weights = aggzoo.list_models(pretrained=True)
    assert "salad_dinov2_vitb14" in with_weights and "gsp_efficientnet_lite0" not in with_weights
    assert all(t.partition(".")[0] in ARCHITECTURES for t in TAGS)
    for name in ARCHITECTURES:
        head, _, backbone = name.partition("_")
        assert head and backbone, f"{name} does not read <head>_<backbone>"


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_every_architecture_builds(name: str) -> None:
    model = _meta(name)
    assert model.aggzoo_architecture == name
    assert model.out_dim > 0
    assert set(model.aggzoo_spec) == {"backbone", "head"}
    for cfg in aggzoo.list_pretrained(f"{name}.*", with_cfg=True):
        variant = _meta(cfg.name)
        assert variant.out_dim == cfg.out_dim, f"{cfg.name}: out_dim {variant.out_dim} != registered {cfg.out_dim}"


@pytest.mark.parametrize("name", [n for n in ARCHITECTURES if n.endswith("efficientnet_lite0")])
def test_small_architectures_run(name: str) -> None:
    torch.manual_seed(0)
    model = aggzoo.create_model(name).eval()
    with torch.no_grad():
        out = model(images(2, (64, 128)))
    assert out.shape == (2, model.out_dim)
    torch.testing.assert_close(out.norm(dim=1), torch.ones(2), atol=1e-4, rtol=0)


def test_official_entries_show_source_licence_and_published_recall() -> None:
    official = aggzoo.list_pretrained("*.official*", with_cfg=True)
    # One per converter at least (SALAD, MegaLoc, BoQ x2, MixVPR, ConvAP, CosPlace, EigenPlaces, ImAge, NetVLAD).
    architectures = {c.architecture for c in official}
    assert {"salad_dinov2_vitb14", "megaloc_dinov2_vitb14", "boq_resnet50", "boq_dinov2_vitb14", "mixvpr_resnet50",
            "convap_resnet50", "cosplace_resnet50", "eigenplaces_resnet50", "image_dinov2_vitb14_reg4",
            "netvlad_resnet50"} <= architectures
    for cfg in official:
        assert cfg.remap is not None and cfg.remap_name.startswith("aggzoo.zoo.")
        assert cfg.source != "(no weights)" and cfg.license and cfg.paper and cfg.code
        assert cfg.out_dim and cfg.input_size[0] == 3
        # place recognition publishes R@1; image retrieval (AP-GeM) mAP per revisited setup
        assert all(k.endswith(("/R@1", "/mAP")) for k in cfg.metrics)
    # REFERENCE.md section 5 figures, on the default tags.
    expected = {
        "convap_resnet50.official": {"pitts30k_test/R@1": 90.5, "msls_val/R@1": 83.5, "nordland/R@1": 42.6},
        "mixvpr_resnet50.official": {"pitts30k_test/R@1": 91.6, "msls_val/R@1": 88.2},
        "boq_resnet50.official": {"pitts30k_test/R@1": 92.4, "msls_val/R@1": 91.2, "nordland_1frame/R@1": 70.7, "sped/R@1": 86.5},
        "salad_dinov2_vitb14.official": {"msls_val/R@1": 92.2, "nordland_1frame/R@1": 76.0, "sped/R@1": 92.1},
        "boq_dinov2_vitb14.official": {"pitts30k_test/R@1": 93.7, "msls_val/R@1": 93.8, "nordland_1frame/R@1": 81.3, "sped/R@1": 92.5},
        "image_dinov2_vitb14_reg4.official": {"pitts30k_test/R@1": 94.0, "msls_val/R@1": 93.0, "nordland_10frames/R@1": 93.2},
        "cosplace_resnet101.official": {"pitts30k_test/R@1": 90.4, "msls_val/R@1": 86.6},
    }
    for name, metrics in expected.items():
        cfg = registry.get_pretrained_cfg(name)
        assert {k: cfg.metrics[k] for k in metrics} == metrics, name
    table = pretrained_table("salad_*")
    assert "https://github.com/serizba/salad/releases/download/v1.0.0/dino_salad.ckpt" in table
    assert "msls_val 92.2" in table and "GPL-3.0" in table


def test_unknown_names_get_close_matches() -> None:
    with pytest.raises(UnknownModelError, match="Did you mean: salad_dinov2_vitb14"):
        aggzoo.create_model("salad_dinov2_vitb41")
    with pytest.raises(UnknownModelError, match="salad_dinov2_vitb14.official"):
        aggzoo.create_model("salad_dinov2_vitb14.offical")
    with pytest.raises(UnknownModelError, match="list_models"):
        aggzoo.create_model("completely_unrelated")


def test_tag_selects_its_variant_without_loading() -> None:
    assert _meta("mixvpr_resnet50.official_128").out_dim == 128
    assert _meta("convap_resnet50.official_8192").out_dim == 8192
    assert _meta("cosplace_resnet50.official_512").out_dim == 512
    assert _meta("mixvpr_resnet50.official_512", out_rows=4).out_dim == 1024  # caller's override wins


def test_head_overrides_and_backbone_kwargs() -> None:
    model = aggzoo.create_model("netvlad_efficientnet_lite0", num_clusters=8, backbone_kwargs={"out_indices": [-1]})
    assert model.out_dim == 8 * 320
    with pytest.raises(ConfigError, match="cannot build NetVLAD .* unexpected keyword argument 'no_such_argument'"):
        aggzoo.create_model("netvlad_efficientnet_lite0", no_such_argument=1)


def test_official_weights_offline_name_the_file_and_place(isolated_dirs: dict[str, Path]) -> None:
    with pytest.raises(WeightsUnavailableError) as info:
        with torch.device("meta"):
            aggzoo.create_model("salad_dinov2_vitb14.official", pretrained=True)
    message = str(info.value)
    assert "https://github.com/serizba/salad/releases/download/v1.0.0/dino_salad.ckpt" in message
    assert str(isolated_dirs["cache"] / "salad_dinov2_vitb14.official" / "dino_salad.ckpt") in message


def test_registration_errors(tiny_registered: str) -> None:
    def gem_testresnet():  # same name, different function
        raise AssertionError

    with pytest.raises(ValueError, match="registered twice"):
        registry.register_model(gem_testresnet)
    registry.register_pretrained(f"{TINY_NAME}.a", PretrainedCfg(url="https://example.org/a.pth"))
    with pytest.raises(ValueError, match="twice"):
        registry.register_pretrained(f"{TINY_NAME}.a", PretrainedCfg(url="https://example.org/a.pth"))
    with pytest.raises(ValueError, match="needs a tag"):
        registry.register_pretrained(TINY_NAME, PretrainedCfg())
    with pytest.raises(UnknownModelError):
        registry.register_pretrained("not_registered_xyz.a", PretrainedCfg())


def test_specs_only_build_aggzoo_modules(tmp_path: Path) -> None:
    spec = {"backbone": dict(_specs.backbone("test_resnet", out_indices=[3])),
            "head": {"_target_": "os.system", "command": "touch /tmp/x"}}
    with pytest.raises(UnsafeSpecError, match="refusing to build 'os.system' as the head"):
        builder.build_model(spec)
    # An allowlist, not a prefix rule: a class inside aggzoo.models that is not a head is refused too.
    spec["head"] = {"_target_": "aggzoo.models.features.Features"}
    with pytest.raises(UnsafeSpecError, match="refusing to build 'aggzoo.models.features.Features'"):
        builder.build_model(spec)
    spec["head"] = {"_target_": "aggzoo.models.heads.gem.GeM", "_recursive_": False}
    with pytest.raises(UnsafeSpecError, match="unsupported keys"):
        builder.build_model(spec)


def test_hydra_configs_are_specs() -> None:
    """The Hydra files of the pipeline and the zoo's specs are the same format (and agree)."""
    spec = {"backbone": OmegaConf.load(REPO / "conf/backbone/tf_efficientnet_lite0.yaml"),
            "head": OmegaConf.load(REPO / "conf/head/gem.yaml")}
    from_yaml = builder.build_model(spec, pretrained_backbone=False)
    from_zoo = aggzoo.create_model("gem_efficientnet_lite0")
    assert from_yaml.aggzoo_spec == from_zoo.aggzoo_spec
    for yaml_name, zoo_spec in [("tf_efficientnet_lite0", _specs.EFFICIENTNET_LITE0),
                                ("tf_efficientnet_lite0_multilevel", _specs.EFFICIENTNET_LITE0_MULTILEVEL),
                                ("image_dinov2_vitb14_reg4", _specs.DINOV2_VITB14_REG4_TOKENS),
                                ("dinov2_vitb14_lopa", _specs.DINOV2_VITB14_LOPA)]:
        yaml = OmegaConf.to_container(OmegaConf.load(REPO / f"conf/backbone/{yaml_name}.yaml"))
        yaml.pop("pretrained")
        assert {k: zoo_spec[k] for k in yaml} == yaml, yaml_name


def test_save_pretrained_round_trip(tiny_registered: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = aggzoo.create_model(tiny_registered)
    with torch.no_grad():
        model.head.pool.p.fill_(2.5)
    folder = aggzoo.save_pretrained(model, tmp_path / "saved")
    config = json.loads((folder / "config.json").read_text())
    assert config["architecture"] == TINY_NAME and config["spec"]["backbone"]["pretrained"] is False
    x = images()
    model.eval()
    for name in (f"local-dir:{folder}", str(folder)):
        loaded = aggzoo.create_model(name)
        assert not loaded.training
        with torch.no_grad():
            torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)


def test_save_pretrained_needs_a_spec_for_foreign_models(tmp_path: Path) -> None:
    from aggzoo.models.backbones.timm_backbone import TimmBackbone
    from aggzoo.models.heads.gem import GeM
    from aggzoo.models.vpr_model import VPRModel

    model = VPRModel(TimmBackbone("test_resnet", out_indices=(3,)), GeM)
    with pytest.raises(ValueError, match="pass spec="):
        aggzoo.save_pretrained(model, tmp_path / "x")
    spec = {"backbone": {"_target_": "aggzoo.models.backbones.timm_backbone.TimmBackbone", "model_name": "test_resnet",
                         "out_indices": [3]},
            "head": {"_target_": "aggzoo.models.heads.gem.GeM", "_partial_": True}}
    folder = aggzoo.save_pretrained(model, tmp_path / "x", spec=spec)
    loaded = aggzoo.create_model(f"local-dir:{folder}")
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(images()), model(images()), rtol=0, atol=0)


def test_local_dir_with_a_hostile_config_is_refused(tmp_path: Path) -> None:
    folder = aggzoo.save_pretrained(tiny_model(), tmp_path / "x", spec=tiny_model().aggzoo_spec)
    config = json.loads((folder / "config.json").read_text())
    config["spec"]["head"]["_target_"] = "subprocess.Popen"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsafeSpecError, match="refusing to build 'subprocess.Popen'"):
        aggzoo.create_model(f"local-dir:{folder}")


def test_missing_local_dir_and_offline_hf_hub(isolated_dirs: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(WeightsUnavailableError, match="config.json"):
        aggzoo.create_model(f"local-dir:{tmp_path / 'nowhere'}")
    with pytest.raises(WeightsUnavailableError) as info:
        aggzoo.create_model("hf-hub:someone/some-model")
    assert "https://huggingface.co/someone/some-model/resolve/main/config.json" in str(info.value)
    assert str(isolated_dirs["cache"] / "hf-hub" / "someone--some-model" / "config.json") in str(info.value)


def test_pretrained_tag_and_checkpoint_path(tiny_registered: str, isolated_dirs: dict[str, Path], tmp_path: Path) -> None:
    torch.manual_seed(1)
    trained = tiny_model()
    with torch.no_grad():
        trained.head.pool.p.fill_(3.7)
    path = isolated_dirs["weights"] / "tiny.safetensors"
    save_file(dict(trained.state_dict()), str(path))
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    registry.register_pretrained(f"{TINY_NAME}.shipped", PretrainedCfg(file=path.name, sha256=sha, input_size=(3, 64, 64),
                                                                        out_dim=64))
    loaded = aggzoo.create_model(TINY_NAME, pretrained=True)  # the default tag
    assert loaded.pretrained_cfg.name == f"{TINY_NAME}.shipped" and not loaded.training
    trained.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(images()), trained(images()), rtol=0, atol=0)
    # A Lightning checkpoint of the pipeline (state_dict keys model.backbone.* / model.head.*).
    ckpt = tmp_path / "last.ckpt"
    torch.save({"state_dict": {f"model.{k}": v for k, v in trained.state_dict().items()}, "epoch": 1}, ckpt)
    from_ckpt = aggzoo.create_model(TINY_NAME, checkpoint_path=ckpt)
    with torch.no_grad():
        torch.testing.assert_close(from_ckpt(images()), trained(images()), rtol=0, atol=0)


def test_load_head_moves_a_trained_head_and_checks_channels(tiny_registered: str, isolated_dirs: dict[str, Path]) -> None:
    from aggzoo.models.backbones.timm_backbone import TimmBackbone

    trained = tiny_model()
    with torch.no_grad():
        trained.head.pool.p.fill_(5.0)
    path = isolated_dirs["weights"] / "tiny.safetensors"
    save_file(dict(trained.state_dict()), str(path))
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    registry.register_pretrained(f"{TINY_NAME}.shipped", PretrainedCfg(file=path.name, sha256=sha))
    same_channels = TimmBackbone("test_resnet", out_indices=(3,))
    model = aggzoo.load_head(f"{TINY_NAME}.shipped", backbone=same_channels)
    assert model.head.pool.p.item() == 5.0 and model.backbone is same_channels
    with pytest.raises(ValueError, match="192 input channels"):
        aggzoo.load_head(f"{TINY_NAME}.shipped", backbone=TimmBackbone("test_resnet", out_indices=(2,)))


def test_strict_loading_of_a_wrong_variant_names_the_keys(tiny_registered: str, tmp_path: Path) -> None:
    model = aggzoo.create_model("netvlad_efficientnet_lite0", num_clusters=4)
    path = tmp_path / "k4.safetensors"
    save_file(dict(model.state_dict()), str(path))
    with pytest.raises(StateDictMismatchError, match=r"head.centroids checkpoint \(4, 112\) vs model \(64, 112\)"):
        aggzoo.create_model("netvlad_efficientnet_lite0", checkpoint_path=path)
