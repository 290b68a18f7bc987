"""SAGE's released checkpoints (chenshunpeng/SAGE): the layouts dumped from the authors' ``network.SAGE``
(``layouts/<name>.official.json``) load through the converter and every tensor lands where it belongs.

The ViT is cut to its first 5 blocks (the model is built with ``depth=5``; block keys are renamed by
index), so the authors' 4 power norms follow blocks 1..4 here as they follow the last 4 blocks upstream.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from official_layouts import assert_placed, authors_layout, fill, save

import aggzoo
from aggzoo.errors import UserError

DEPTH = 5


def _cut(shapes: list[tuple[str, tuple[int, ...]]]) -> list[tuple[str, tuple[int, ...]]]:
    keep = []
    for key, shape in shapes:
        block = re.match(r"backbone\.model\.blocks\.(\d+)\.", key)
        if block is None or int(block.group(1)) < DEPTH:
            keep.append((key, shape))
    return keep


def _file(upstream: dict[str, torch.Tensor], path: Path) -> Path:
    # eval.py reads ckpt['model_state_dict'] and strips a DataParallel 'module.' prefix when present.
    return save({"model_state_dict": {f"module.{k}": v for k, v in upstream.items()}}, path)


def _expected_target(key: str) -> str | None:
    """Where each upstream tensor belongs, from the two modules' names (see aggzoo.zoo.sage's docstring)."""
    if key == "backbone.model.mask_token" or key.startswith("aggregator.single_branch."):
        return None
    if key.startswith("backbone.gpn_norms."):
        return key.replace("backbone.gpn_norms.", "backbone.recalibrations.", 1)
    if key.startswith("backbone.model."):
        return key
    if key.startswith("aggregator."):
        return "head." + key.removeprefix("aggregator.")
    assert key.startswith("encoder."), key
    return "head." + key


@pytest.mark.parametrize(("name", "width", "cross_image"), [
    ("sagecross_dinov2_vitl14", 1024, True),
    ("sage_dinov2_vitl14", 1024, False),
    ("sage_dinov2_vitb14", 768, False),
])
def test_sage_official(tmp_path: Path, name: str, width: int, cross_image: bool) -> None:
    upstream = fill(_cut(authors_layout(f"{name}.official")))
    assert any(k.startswith("aggregator.single_branch.") for k in upstream)  # the unused branch is in the file
    assert any(k.startswith("encoder.") for k in upstream) == cross_image
    path = _file(upstream, tmp_path / "SAGE.pth")
    model = aggzoo.create_model(f"{name}.official", checkpoint_path=path, backbone_kwargs={"depth": DEPTH})
    mapping = {key: _expected_target(key) for key in upstream}
    # The 37 x 37 DINOv2 grid is kept (resampled per input by DINOv2's rule): unchanged tensor.
    assert_placed(model, upstream, mapping)
    assert model.out_dim == 8448 and model.backbone.out_channels == width
    assert model.head.batch_dependent == cross_image
    assert model.backbone.first_recalibrated == DEPTH - 4


def test_a_file_with_a_key_sage_does_not_have_is_refused(tmp_path: Path) -> None:
    upstream = fill(_cut(authors_layout("sage_dinov2_vitb14.official")))
    upstream["aggregator.queries"] = torch.zeros(1, 64, 768)
    path = _file(upstream, tmp_path / "SAGE_ViT-B.pth")
    with pytest.raises(UserError, match="aggregator.queries"):
        aggzoo.create_model("sage_dinov2_vitb14.official", checkpoint_path=path, backbone_kwargs={"depth": DEPTH})


def test_the_cross_image_file_does_not_load_into_the_model_without_encoder(tmp_path: Path) -> None:
    upstream = fill(_cut(authors_layout("sagecross_dinov2_vitl14.official")))
    path = _file(upstream, tmp_path / "SAGE.pth")
    with pytest.raises(UserError, match="encoder"):
        aggzoo.create_model("sage_dinov2_vitl14.official", checkpoint_path=path, backbone_kwargs={"depth": DEPTH})


FIXTURE = Path(__file__).with_name("fixtures") / "sage_softp_small.safetensors"


def test_head_matches_the_authors_softp_and_encoder_outputs() -> None:
    """``fixtures/sage_softp_small.safetensors``: the authors' ``SoftP`` at small widths with ``network.py``'s
    flags, and an encoder built as ``network.py`` builds it (at d_model 32), with their outputs on a fixed input
    (its metadata names the source). Converted by the zoo's rules, our head gives the same numbers."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    from aggzoo.hub.remap import rename
    from aggzoo.models.features import Features
    from aggzoo.models.heads.sage import SAGE
    from aggzoo.zoo.sage import SAGE_RULES

    with safe_open(str(FIXTURE), "pt") as handle:
        assert "chenshunpeng/SAGE@" in handle.metadata()["source"]
    data = load_file(str(FIXTURE))
    weights = {k: v for k, v in data.items() if not k.startswith(("input.", "output."))}
    converted = rename(weights, SAGE_RULES, what="SAGE fixture")
    head = SAGE(32, num_clusters=8, cluster_dim=16, token_dim=32, cross_image=True, encoder_dim=32,
                encoder_heads=16, encoder_ffn_dim=64).eval()
    head.load_state_dict({k.removeprefix("head."): v for k, v in converted.items()}, strict=True)
    features = Features((data["input.features"],), cls=data["input.cls"])
    with torch.no_grad():
        torch.testing.assert_close(head.descriptor(features), data["output.descriptor"], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(head(features), data["output.encoded"], atol=1e-5, rtol=1e-5)
