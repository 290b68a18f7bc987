"""The one ``aggzoo`` command: each subcommand reaches its module's parser and prints what the
registry holds (checked against weights/manifest.json, read here independently)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aggzoo.cli.main import COMMANDS, main

MANIFEST = json.loads((Path(__file__).resolve().parents[1] / "weights" / "manifest.json").read_text())


def test_info_prints_the_pretrained_cfg(capsys: pytest.CaptureFixture[str]) -> None:
    entry = next(e for e in MANIFEST["entries"] if e["name"] == "netvlad_efficientnet_lite0.synthetic")
    assert main(["info", entry["name"]]) == 0
    out = capsys.readouterr().out
    h, w = entry["input_size"][1:]
    assert f"licence       {entry['license']}" in out and f"descriptor D  {entry['out_dim']}" in out
    assert f"input {h} x {w} (H x W), {entry['interpolation']} resize, mean {entry['mean']}" in out
    assert f"sha256        {entry['sha256']}" in out and entry["recipe"] in out
    for metric, value in entry["metrics"].items():
        assert f"{metric}: {value:g}" in out


def test_info_of_an_architecture_lists_its_weights(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", "netvlad_efficientnet_lite0"]) == 0
    out = capsys.readouterr().out
    assert all(e["name"] in out for e in MANIFEST["entries"] if e["name"].startswith("netvlad_efficientnet_lite0."))


def test_an_unknown_name_is_one_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["info", "netvlad_efficientnet_lite0.synthetik"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: unknown pretrained tag") and "synthetic" in err[0]


def test_models_lists_the_matching_weights(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "*efficientnet_lite0.*"]) == 0  # the shipped weights, all of them EfficientNet-Lite0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "|---" not in line][1:]
    assert sorted(row.split(" | ")[0][2:] for row in rows) == sorted(e["name"] for e in MANIFEST["entries"])


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_subcommand_has_its_own_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0 and capsys.readouterr().out.startswith(f"usage: aggzoo {command}")
