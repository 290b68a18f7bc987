"""Publishing: save_pretrained writes a Hugging Face model repository (config.json, model.safetensors,
a README.md card with YAML front matter and the run's metrics), push_to_hub uploads it with HfApi
to a local Hugging Face-style endpoint (tests/hub/hub_servers.py), and create_model("hf-hub:...")
loads it back with identical outputs."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import torch
import yaml
from hub_helpers import TINY_NAME, images
from hub_servers import LocalHub

import aggzoo
from aggzoo.errors import ConfigError, PublishError
from aggzoo.hub.card import hf_license
from aggzoo.hub.cfg import PretrainedCfg

# What a train.py run writes (the shapes of evaluation/report.to_json and run/pipeline's run_summary.json).
RUN_SUMMARY = {"overrides": ["head=gem", "trainer.max_epochs=3"], "epochs": 3, "global_step": 42,
               "image_size": [48, 64], "test": {"trained": {"synthetic_test": {"1": 0.875, "5": 1.0}}}}
TEST_RESULTS = {"meta": {}, "results": [
    {"label": "untrained", "name": "synthetic_test", "recalls": {"1": 0.25, "5": 0.5}, "num_queries": 24,
     "num_database": 96},
    {"label": "trained", "name": "synthetic_test", "recalls": {"1": 0.875, "5": 1.0}, "num_queries": 24,
     "num_database": 96}]}


def _front_matter(card: str) -> dict:
    assert card.startswith("---\n")
    return yaml.safe_load(card[4:].split("\n---\n", 1)[0])


@pytest.fixture
def trained_tiny(tiny_registered: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = aggzoo.create_model(tiny_registered)
    with torch.no_grad():
        model.head.pool.p.fill_(2.5)
    return model.eval()


@pytest.fixture
def run_files(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "run").mkdir()
    summary, results = tmp_path / "run" / "run_summary.json", tmp_path / "run" / "test_results.json"
    summary.write_text(json.dumps(RUN_SUMMARY))
    results.write_text(json.dumps(TEST_RESULTS))
    return {"run_summary": summary, "test_results": results}


def test_push_to_hub_then_load_it_back(trained_tiny: torch.nn.Module, local_hub: LocalHub,
                                       run_files: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    info = aggzoo.push_to_hub(trained_tiny, "me/tiny-gem", license="Apache-2.0", **run_files)
    files = local_hub.files("me/tiny-gem")
    assert set(files) == {"config.json", "model.safetensors", "README.md"} and info.oid == local_hub.repos["me/tiny-gem"].main
    assert json.loads(files["config.json"])["spec"]["head"]["_target_"] == "aggzoo.models.heads.gem.GeM"
    card = files["README.md"].decode()
    meta = _front_matter(card)
    assert meta["license"] == "apache-2.0" and meta["library_name"] == "aggzoo"
    assert meta["pipeline_tag"] == "image-feature-extraction" and {"aggzoo", "gem", "test_resnet"} <= set(meta["tags"])
    assert 'aggzoo.create_model("hf-hub:me/tiny-gem")' in card
    assert "`aggzoo-train head=gem trainer.max_epochs=3`" in card  # the recipe, from run_summary.json
    assert "| trained | synthetic_test | 87.5 | 100.0 | 24 | 96 |" in card  # test_results.json, in percent
    assert "| untrained | synthetic_test | 25.0 | 50.0 | 24 | 96 |" in card

    loaded = aggzoo.create_model("hf-hub:me/tiny-gem")  # empty Hugging Face cache: downloaded from the server
    x = images()
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), trained_tiny(x), rtol=0, atol=0)
    assert loaded.aggzoo_architecture == TINY_NAME

    # A second push is a new commit; the first stays loadable by its id.
    first = info.oid
    with torch.no_grad():
        trained_tiny.head.pool.p.fill_(4.0)
    assert aggzoo.push_to_hub(trained_tiny, "me/tiny-gem").oid != first
    old, new = aggzoo.create_model(f"hf-hub:me/tiny-gem@{first}"), aggzoo.create_model("hf-hub:me/tiny-gem")
    assert old.head.pool.p.item() == 2.5 and new.head.pool.p.item() == 4.0


def test_push_without_a_token_says_how_to_log_in(trained_tiny: torch.nn.Module, local_hub: LocalHub) -> None:
    with pytest.raises(PublishError) as info:
        aggzoo.push_to_hub(trained_tiny, "me/tiny-gem")
    assert "me/tiny-gem" in str(info.value) and "HF_TOKEN" in str(info.value) and "401" in str(info.value)
    assert "me/tiny-gem" not in local_hub.repos


def test_save_pretrained_card_records_provenance(trained_tiny: torch.nn.Module, tmp_path: Path) -> None:
    cfg = PretrainedCfg(architecture=TINY_NAME, tag="demo", license="MIT (someone/upstream)",
                        paper="A paper (arXiv:0000.00000)", code="https://github.com/someone/upstream",
                        recipe="python train.py head=gem", metrics={"pitts30k/R@1": 90.5}, input_size=(3, 48, 64))
    folder = aggzoo.save_pretrained(trained_tiny, tmp_path / "saved", pretrained_cfg=cfg)
    card = (folder / "README.md").read_text()
    assert _front_matter(card)["license"] == "mit"
    assert "# gem_testresnet.demo" in card and "`python train.py head=gem`" in card
    assert "| pitts30k/R@1 | 90.5 |" in card and "A paper (arXiv:0000.00000)" in card
    assert "resized to 48 x 64" in card and 'create_model("local-dir:<this folder>")' in card
    assert aggzoo.create_model(f"local-dir:{folder}").pretrained_cfg.license == "MIT (someone/upstream)"


def test_licences_the_hub_has_no_identifier_for() -> None:
    assert hf_license("GPL-3.0 (serizba/salad)") == {"license": "gpl-3.0"}
    assert hf_license("no licence stated (amaralibey/MixVPR has no LICENSE file)") == {
        "license": "other", "license_name": "no-licence-stated-amaralibey-mixvpr-has-no-license-file"}
    assert hf_license(None) == {"license": "other", "license_name": "unspecified"}


def test_a_results_file_that_is_not_one_is_named(trained_tiny: torch.nn.Module, tmp_path: Path) -> None:
    bad = tmp_path / "run_summary.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="run_summary.json is not valid JSON"):
        aggzoo.save_pretrained(trained_tiny, tmp_path / "x", run_summary=bad)
    bad.write_text(json.dumps({"epochs": 3}))
    with pytest.raises(ConfigError, match="not a results file"):
        aggzoo.save_pretrained(trained_tiny, tmp_path / "x", run_summary=bad)
    assert not (tmp_path / "x").exists()  # nothing half-written


def test_weight_files_are_byte_reproducible(trained_tiny: torch.nn.Module, tmp_path: Path) -> None:
    """The same tensors and metadata give the same bytes (and so the same sha256 in a manifest) on every
    call: safetensors' own metadata order varies from call to call, save_weights sorts it."""
    import struct

    from safetensors import safe_open

    from aggzoo.hub.checkpoint import sha256_of
    from aggzoo.hub.saving import save_weights

    metadata = {key: key * 3 for key in "hgfedcba"}  # 8 keys: 40320 orders
    state = trained_tiny.state_dict()
    digests = {sha256_of(save_weights(state, tmp_path / f"w{i}.safetensors", metadata)) for i in range(5)}
    assert len(digests) == 1
    raw = (tmp_path / "w0.safetensors").read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + length])
    assert list(header["__metadata__"]) == sorted(metadata)
    with safe_open(str(tmp_path / "w0.safetensors"), "pt") as f:  # still a valid file, contents unchanged
        assert f.metadata() == metadata
        assert set(f.keys()) == set(state) and all(torch.equal(f.get_tensor(k), state[k]) for k in state)
    # save_pretrained goes through it: two saves of one model are the same file.
    first = aggzoo.save_pretrained(trained_tiny, tmp_path / "a") / "model.safetensors"
    second = aggzoo.save_pretrained(trained_tiny, tmp_path / "b") / "model.safetensors"
    assert first.read_bytes() == second.read_bytes()


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_saved_files_get_the_mode_the_umask_gives(trained_tiny: torch.nn.Module, tmp_path: Path, umask: int,
                                                   mode: int) -> None:
    """Every file of a saved folder is created as any file of the process is (0666 less the umask):
    safetensors writes a private 0600 temporary file and renames it, so the weights were 0600 while
    config.json was 0644, and others in the group could not read them."""
    previous = os.umask(umask)
    try:
        folder = aggzoo.save_pretrained(trained_tiny, tmp_path / "saved")
    finally:
        os.umask(previous)
    modes = {path.name: oct(stat.S_IMODE(path.stat().st_mode)) for path in sorted(folder.iterdir())}
    assert modes == dict.fromkeys(["README.md", "config.json", "model.safetensors"], oct(mode))
