"""AnyLoc: the hard-assignment VLAD head against the paper's formula and the authors' module, and the
ViT facet backbone against the qkv of that block computed by hand."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import timm
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file

from aggzoo.models.backbones.vit_facet import FACETS, ViTFacet
from aggzoo.models.features import Features
from aggzoo.models.heads.anyloc import AnyLocVLAD

FIXTURE = Path(__file__).resolve().parents[1] / "convert" / "fixtures" / "anyloc_vlad_parity.safetensors"


def brute_force_vlad(x: torch.Tensor, centres: torch.Tensor) -> torch.Tensor:
    """AnyLoc's VLAD written from the paper's formula, one image, one local feature at a time, in float64:
    ``x: [C, H, W]`` -> normalise each local feature; its word is the centre of largest cosine similarity;
    ``V_k = sum over its features of (x_i - c_k)``; each non-empty ``V_k`` divided by its norm; concatenated in
    centre order; the whole divided by its norm."""
    channels, height, width = x.shape
    c = centres.double()
    blocks = [torch.zeros(channels, dtype=torch.float64) for _ in range(c.shape[0])]
    for row in range(height):
        for col in range(width):
            feature = x[:, row, col].double()
            feature = feature / math.sqrt(float((feature * feature).sum()))
            cosines = [float(feature @ c[k]) / math.sqrt(float(c[k] @ c[k])) for k in range(c.shape[0])]
            word = cosines.index(max(cosines))
            blocks[word] = blocks[word] + (feature - c[word])
    blocks = [b / math.sqrt(float(b @ b)) if float(b @ b) > 0 else b for b in blocks]
    vlad = torch.cat(blocks)
    return vlad / math.sqrt(float(vlad @ vlad))


def _head(centres: torch.Tensor) -> AnyLocVLAD:
    head = AnyLocVLAD(centres.shape[1], num_clusters=centres.shape[0])
    head.centroids.copy_(centres)
    return head.eval()


@pytest.mark.parametrize("seed", [0, 1])
def test_vlad_matches_the_formula_computed_by_brute_force(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    centres = 0.6 * torch.randn(4, 5, generator=gen)  # not unit norm: residuals are taken from the raw centre
    maps = torch.randn(3, 5, 3, 4, generator=gen)
    # image 2: every feature near centre 0 or 1, so centres 2 and 3 are empty (their blocks stay zero)
    near = centres[torch.tensor([0, 1] * 6)] + 0.01 * torch.randn(12, 5, generator=gen)
    maps[2] = near.T.reshape(5, 3, 4)
    with torch.no_grad():
        ours = _head(centres)(Features(maps=(maps,)))
    expected = torch.stack([brute_force_vlad(m, centres) for m in maps]).float()
    torch.testing.assert_close(ours, expected, atol=1e-6, rtol=0)
    assert ours.shape == (3, 20)
    assert torch.count_nonzero(ours[2].view(4, 5)[2:]) == 0  # the empty clusters, exactly zero


def test_vlad_matches_the_authors_module_on_their_fixture() -> None:
    """The authors' ``VLAD`` (AnyLoc/DINO ``utilities.py``) fitted its own centres and computed these descriptors
    (``tests/convert/fixtures/anyloc_vlad_parity.safetensors``, see its ``source`` metadata)."""
    data = load_file(str(FIXTURE))
    with safe_open(str(FIXTURE), framework="pt") as file:
        assert "AnyLoc/DINO@" in file.metadata()["source"]
    descriptors, theirs = data["descriptors"], data["vlad"]  # [3, 35, 96] (h=7, w=5 row-major), [3, 8 * 96]
    maps = descriptors.transpose(1, 2).reshape(3, 96, 7, 5)
    with torch.no_grad():
        ours = _head(data["c_centers"])(Features(maps=(maps,)))
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)


def test_init_from_clusters_keeps_the_members_means_as_the_authors_kmeans() -> None:
    """fast_pytorch_kmeans (cosine) leaves each centre at the mean of its normalised members and an empty one
    at zero: one cosine update from any k-means' centres gives exactly that."""
    gen = torch.Generator().manual_seed(3)
    descriptors = torch.randn(200, 6, generator=gen) * torch.rand(200, 1, generator=gen)  # not unit norm
    start = F.normalize(torch.randn(3, 6, generator=gen), dim=1)
    centres = torch.cat([start, 2.0 * start[:1]])  # centre 3 ties with centre 0 everywhere: the lower index wins
    head = AnyLocVLAD(6, num_clusters=4)
    head.init_from_clusters(centres, descriptors)
    points = F.normalize(descriptors, dim=1)
    words = torch.tensor([max(range(4), key=lambda k: float(p @ centres[k]) / float(centres[k].norm())) for p in points])
    assert not (words == 3).any()
    for k in range(4):
        members = points[words == k]
        expected = members.mean(dim=0) if len(members) else torch.zeros(6)
        torch.testing.assert_close(head.centroids[k], expected, atol=1e-6, rtol=0)
    assert torch.count_nonzero(head.centroids[3]) == 0
    assert (head.centroids.norm(dim=1) < 1).all()


def test_the_vocabulary_is_saved_with_the_weights() -> None:
    head = AnyLocVLAD(8, num_clusters=3)
    assert "centroids" in head.state_dict() and not list(head.parameters())
    with pytest.raises(ValueError, match=r"\(3, 8\)"):
        head.init_from_clusters(torch.zeros(2, 8), torch.zeros(10, 8))


# -- the facet backbone ------------------------------------------------------------------------------


def _hooked_reference(facet: ViTFacet, **kwargs) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """A full timm ViT with the same weights and hooks where AnyLoc puts them: on ``blocks[b]`` (its input and
    output) and on ``blocks[b].attn.qkv``."""
    torch.manual_seed(123)
    reference = timm.create_model(facet.model_name, num_classes=0, dynamic_img_size=True, **kwargs).eval()
    missing, unexpected = reference.load_state_dict(facet.model.state_dict(), strict=False)
    assert not unexpected
    assert all(k.startswith(("norm.", *(f"blocks.{i}." for i in range(facet.block + 1, 99)))) for k in missing)
    seen: dict[str, torch.Tensor] = {}
    block = reference.blocks[facet.block]
    block.register_forward_hook(lambda m, inputs, out: seen.update(block_in=inputs[0], block_out=out))
    block.attn.qkv.register_forward_hook(lambda m, inputs, out: seen.update(qkv=out))
    return reference, seen


@pytest.mark.parametrize("facet", FACETS)
@pytest.mark.parametrize("registers", [0, 2])
def test_facet_is_that_blocks_qkv_computed_by_hand(facet: str, registers: int) -> None:
    kwargs = {"reg_tokens": registers} if registers else {}
    torch.manual_seed(0)
    backbone = ViTFacet("test_vit", block=2, facet=facet, dynamic_img_size=True, **kwargs).eval()
    reference, seen = _hooked_reference(backbone, **kwargs)
    images = torch.randn(2, 3, 48, 80)  # a 3 x 5 patch grid: rows and columns cannot be confused
    with torch.no_grad():
        features = backbone(images)
        reference(images)
        block = reference.blocks[2]
        tokens_in = seen["block_in"]
        # the fused projection by hand: LayerNorm (norm1's weights) then x W^T + b, split in thirds
        normed = F.layer_norm(tokens_in, (tokens_in.shape[-1],), block.norm1.weight, block.norm1.bias, block.norm1.eps)
        qkv = normed @ block.attn.qkv.weight.T + block.attn.qkv.bias
    torch.testing.assert_close(qkv, seen["qkv"], atol=1e-5, rtol=0)
    channels = tokens_in.shape[-1]
    expected = seen["block_out"] if facet == "token" else qkv[..., FACETS.index(facet) * channels:(FACETS.index(facet) + 1) * channels]
    prefix = 1 + registers
    assert features.last.shape == (2, channels, 3, 5)
    for row in range(3):
        for col in range(5):
            torch.testing.assert_close(features.last[:, :, row, col], expected[:, prefix + row * 5 + col], atol=1e-5, rtol=0)
    torch.testing.assert_close(features.cls, expected[:, 0], atol=1e-5, rtol=0)
    assert len(backbone.model.blocks) == 3  # the blocks after the facet's are not built


def test_facet_refuses_unknown_facets_and_non_vits() -> None:
    with pytest.raises(ValueError, match="facet must be one of"):
        ViTFacet("test_vit", block=1, facet="keys")
    with pytest.raises(ValueError, match="needs a ViT"):
        ViTFacet("test_resnet", block=1)
