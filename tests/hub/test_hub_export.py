"""Export: ONNX, TorchScript and torch.export files reproduce the eager descriptors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hub_helpers import images, tiny_model

import aggzoo
from aggzoo.cli.export import ExportError, check_parity, export_and_check, load_exported, main


@pytest.mark.parametrize("fmt", ["onnx", "torchscript", "export"])
def test_export_matches_eager(fmt: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    from aggzoo.models.heads.netvlad import NetVLAD
    from aggzoo.zoo._backbones import backbone, head, vpr

    model = vpr(backbone("test_resnet", out_indices=[3]), head(NetVLAD, num_clusters=8)).eval()
    result = export_and_check(model, fmt, tmp_path / f"model.{fmt}", (64, 96), atol=1e-4)
    assert result.path.is_file() and result.max_abs_diff <= 1e-4
    # The check is not vacuous: a different model is caught.
    other = vpr(backbone("test_resnet", out_indices=[3]), head(NetVLAD, num_clusters=8)).eval()
    assert check_parity(other, load_exported(result.path, fmt), [images(2, (64, 96))]) > 1e-3


def test_cli_exports_a_saved_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tiny_model()
    folder = aggzoo.save_pretrained(model, tmp_path / "tiny")
    output = tmp_path / "tiny.pt"
    assert main([f"local-dir:{folder}", "--format", "torchscript", "--output", str(output), "--image-size", "64", "64"]) == 0
    assert output.is_file() and "max |exported - eager|" in capsys.readouterr().out


def test_unexportable_model_gets_one_clear_error(tmp_path: Path) -> None:
    class DataDependent(torch.nn.Module):
        out_dim = 1

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            # Python control flow on a tensor's value: torch.export cannot capture it.
            if x.sum() > 0:
                return x.flatten(1)[:, :1]
            return -x.flatten(1)[:, :1]

    with pytest.raises(ExportError, match="cannot export DataDependent to export"):
        export_and_check(DataDependent(), "export", tmp_path / "x.pt2", (8, 8))
