"""SelaVPR++ against independent expectations: the side path rebuilt from timm's own block outputs, its
initial state (the features of the block it starts from), the two branches of one pass, the float head and
the codes by hand, the straight-through gradient, and the binary first stage (Hamming shortlist by brute
force, exact float re-scoring) down to eval.py's evaluate_benchmarks on image files."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from image_files import write_noise_images

from aggzoo.data.retrieval_set import RetrievalSet
from aggzoo.errors import ConfigError
from aggzoo.evaluation.benchmarks import evaluate_benchmarks
from aggzoo.evaluation.binary_codes import BinaryCodes, pack_codes
from aggzoo.evaluation.extraction import extract_descriptors
from aggzoo.evaluation.options import EvaluationOptions, ExtractionOptions, OutputOptions, SearchOptions
from aggzoo.evaluation.search import search
from aggzoo.layers.binarize import sign_ste
from aggzoo.layers.pooling import gem
from aggzoo.models.backbones.side_adapter import SideAdapterViT
from aggzoo.models.features import Features
from aggzoo.models.heads.selavprpp import SelaVPRpp
from aggzoo.models.vpr_model import VPRModel
from aggzoo.run.preflight import evaluation_option_problems

faiss = pytest.importorskip("faiss")

TINY = {"depth": 3, "embed_dim": 64, "num_heads": 2, "dynamic_img_size": True}
VIT = "vit_small_patch14_dinov2"


def _randomise_adapters(adapters: torch.nn.ModuleList, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in adapters.parameters():
            t.copy_(0.2 * torch.randn(t.shape, generator=gen))


@pytest.mark.parametrize("start", [0, 1])
def test_side_path_equals_the_recurrence_on_timms_own_block_outputs(start: int) -> None:
    torch.manual_seed(0)
    backbone = SideAdapterViT(VIT, start_block=start, hashing=True, **TINY).eval()
    assert len(backbone.adapters) == TINY["depth"] - start
    images = torch.randn(2, 3, 42, 56)
    vit = backbone.model
    with torch.no_grad():
        # At initialisation (fc2 = 0) y never moves: the features are norm(input of block s).
        x0 = vit.norm_pre(vit._pos_embed(vit.patch_embed(images)))
        outputs = [x0]
        for block in vit.blocks:  # timm's blocks called as timm calls them
            outputs.append(block(outputs[-1]))
        initial = backbone(images)
        torch.testing.assert_close(initial.cls, vit.norm(outputs[start])[:, 0])
        _randomise_adapters(backbone.adapters, 1)
        _randomise_adapters(backbone.adapters_hashing, 2)
        paths = {}
        for name, adapters in (("float", backbone.adapters), ("hash", backbone.adapters_hashing)):
            y = outputs[start]
            for j, adapter in enumerate(adapters):
                y = y + adapter(y + outputs[start + j + 1], (3, 4), 1)
            paths[name] = vit.norm(y)
        float_features, hash_features = backbone.forward_branches(images)
        for got, name in ((backbone(images), "float"), (float_features, "float"),
                          (backbone.forward_hashing(images), "hash"), (hash_features, "hash")):
            torch.testing.assert_close(got.cls, paths[name][:, 0], rtol=1e-5, atol=1e-5)
            expected_map = paths[name][:, 1:].reshape(2, 3, 4, -1).permute(0, 3, 1, 2)
            torch.testing.assert_close(got.last, expected_map, rtol=1e-5, atol=1e-5)
        assert (float_features.last - hash_features.last).abs().max() > 1e-3  # two independent side paths
        backbone.init_hashing_from_float()
        torch.testing.assert_close(backbone.forward_hashing(images).last, backbone(images).last)


def test_only_the_side_path_and_head_train_and_nothing_backpropagates_through_the_vit() -> None:
    torch.manual_seed(0)
    model = VPRModel(SideAdapterViT(VIT, **TINY), functools.partial(SelaVPRpp, out_dim=24))
    _randomise_adapters(model.backbone.adapters, 3)
    model(torch.randn(2, 3, 28, 28)).pow(2).sum().backward()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith(("backbone.adapters.", "head.")) for n in trainable)
    assert all(p.grad is not None for n, p in model.named_parameters() if n in trainable)
    assert all(p.grad is None for p in model.backbone.model.parameters())
    with pytest.raises(ValueError, match="hashing=True"):
        model.backbone.forward_hashing(torch.randn(1, 3, 28, 28))


def test_head_by_hand_and_codes_with_plus_one_at_zero() -> None:
    torch.manual_seed(0)
    head = SelaVPRpp(16, out_dim=12, hashing=True, bits=8).eval()
    with torch.no_grad():
        head.float_branch.gem.p.fill_(2.5)
        head.hash_branch.gem.p.fill_(3.5)
    x = torch.randn(2, 16, 3, 5)
    with torch.no_grad():
        def branch(w1: torch.nn.Linear, w2: torch.nn.Linear, p: float) -> torch.Tensor:
            tokens = x.flatten(2).transpose(1, 2) @ w1.weight.T + w1.bias       # [B, HW, C]
            pooled = gem(F.normalize(tokens, dim=2).transpose(1, 2)[..., None], p)
            return F.normalize(pooled @ w2.weight.T + w2.bias, dim=1)

        expected = branch(head.float_branch.token, head.float_branch.out, 2.5)
        z = branch(head.hash_branch.token, head.hash_branch.out, 3.5)
        torch.testing.assert_close(head(Features((x,))), expected)
        torch.testing.assert_close(head.hash_embedding(Features((x,))), z)
        codes = head.binary_codes(Features((x,)))
    assert head.out_dim == 12 and codes.shape == (2, 8)
    assert torch.equal(codes, torch.where(z >= 0, 1.0, -1.0))
    assert sign_ste(torch.tensor([0.0, -0.0, -1e-30, 3.0])).tolist() == [1.0, 1.0, -1.0, 1.0]
    z = torch.randn(5, requires_grad=True)
    (sign_ste(z) * torch.arange(5.0)).sum().backward()
    assert torch.equal(z.grad, torch.arange(5.0))  # straight through
    # upstream's packing: (b + 1) // 2 -> np.packbits, most significant bit first
    assert pack_codes(np.array([[1, -1, -1, -1, -1, -1, -1, 1]])).tolist() == [[129]]


def _hamming(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.unpackbits(a[:, None] ^ b[None], axis=2).sum(axis=2)


def test_binary_first_stage_shortlists_by_hamming_and_rescores_the_float_descriptors() -> None:
    rng = np.random.default_rng(0)
    n, q, bits, m, k = 300, 20, 64, 30, 5
    database = rng.standard_normal((n, 16)).astype(np.float32)
    database /= np.linalg.norm(database, axis=1, keepdims=True)
    queries = database[:q] + 0.5 * rng.standard_normal((q, 16)).astype(np.float32)
    db_codes = pack_codes(np.where(rng.standard_normal((n, bits)) >= 0, 1, -1))
    q_codes = pack_codes(np.where(rng.standard_normal((q, bits)) >= 0, 1, -1))
    ids = search(database, queries, k, SearchOptions(index="BFlat", refine=m), codes=(db_codes, q_codes))
    distances = _hamming(q_codes, db_codes)                                       # [Q, N] brute force
    for i in range(q):
        shortlist = np.argsort(distances[i], kind="stable")[:m]
        bound = distances[i, shortlist[-1]]
        # the exact float top-k of that shortlist, where candidates tied at the boundary may swap in
        inside = np.flatnonzero(distances[i] < bound)
        tied = np.flatnonzero(distances[i] == bound)
        scores = database @ queries[i]
        got = ids[i]
        assert set(got) <= set(inside) | set(tied)
        assert np.all(np.diff(scores[got]) <= 0)  # re-scored by the float inner product, best first
        rest = np.setdiff1d(inside, got)
        assert rest.size == 0 or scores[rest].max() <= scores[got].min()  # no better candidate of the sure part
    with pytest.raises(ConfigError, match="refine=100"):
        search(database, queries, k, SearchOptions(index="BFlat"), codes=(db_codes, q_codes))


def test_two_branch_evaluation_on_image_files(tmp_path: Path) -> None:
    paths = write_noise_images(tmp_path, 8, (28, 28, 3), seed=2, high=255)
    retrieval_set = RetrievalSet("tiny", tuple(paths[:6]), (paths[2], paths[4], paths[7]),
                                 (np.array([2]), np.array([4]), np.array([1])))
    torch.manual_seed(0)
    model = VPRModel(SideAdapterViT(VIT, hashing=True, **TINY), functools.partial(SelaVPRpp, out_dim=24, hashing=True,
                                                                                   bits=16))
    _randomise_adapters(model.backbone.adapters, 4)
    _randomise_adapters(model.backbone.adapters_hashing, 5)

    def transform(rgb: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(rgb).permute(2, 0, 1).float() / 255.0

    m = 3
    passes: list[int] = []  # images entering the frozen ViT's first block
    hook = model.backbone.model.blocks[0].register_forward_pre_hook(lambda _, args: passes.append(len(args[0])))
    options = EvaluationOptions(ks=(1, 2), extraction=ExtractionOptions(batch_size=4),
                                search=SearchOptions(index="BFlat", refine=m), outputs=OutputOptions(pictures=False))
    (result,) = evaluate_benchmarks(model, [retrieval_set], transform, options)
    hook.remove()
    assert sum(passes) == 6 + 3  # one ViT pass per image gives both the float descriptor and the codes
    # independently: codes and float descriptors of both splits, Hamming top m (ties: any), float order
    codes = [extract_descriptors(BinaryCodes(model), split, transform).astype(np.int64)
             for split in (retrieval_set.database_paths, retrieval_set.query_paths)]
    assert set(np.unique(codes[0])) <= {-1, 1}
    floats = [extract_descriptors(model, split, transform)
              for split in (retrieval_set.database_paths, retrieval_set.query_paths)]
    hamming = (codes[1][:, None] != codes[0][None]).sum(axis=2)
    for i, row in enumerate(result.predictions):
        assert hamming[i, row[0]] <= np.sort(hamming[i])[m - 1]
        scores = floats[0] @ floats[1][i]
        assert scores[row[0]] >= scores[row[1]]
    assert result.recalls[1] >= 2 / 3  # the two queries that are database images find themselves
    disk = SearchOptions(index="BFlat", refine=m, refine_store="disk", store_dir=tmp_path / "store")
    (on_disk,) = evaluate_benchmarks(model, [retrieval_set], transform, dataclasses.replace(options, search=disk))
    np.testing.assert_array_equal(on_disk.predictions, result.predictions)
    stored = np.load(tmp_path / "store" / "tiny_database.npy")  # [N, D + bits]: the descriptors, then the codes
    np.testing.assert_allclose(stored[:, :24], floats[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(stored[:, 24:], codes[0])
    float_model = VPRModel(SideAdapterViT(VIT, **TINY), functools.partial(SelaVPRpp, out_dim=24))
    with pytest.raises(ConfigError, match="official_rerank"):
        evaluate_benchmarks(float_model, [retrieval_set], transform, dataclasses.replace(options, ks=(1,)))


def test_preflight_checks_the_binary_first_stage_before_extraction() -> None:
    def problems(**search: object) -> list[str]:
        return evaluation_option_problems(EvaluationOptions(search=SearchOptions(**search)), 2048)

    assert problems(index="BFlat", refine=100) == []
    (missing,) = problems(index="BFlat")
    assert "evaluation.search.refine=100" in missing
    assert any("binary index string" in p for p in problems(index="BFlatx", refine=100))


@pytest.mark.parametrize("one_pass", [True, False])
def test_descriptors_and_codes_equal_the_model_and_its_hashing_branch(one_pass: bool) -> None:
    """BinaryCodes(with_descriptors=True) is [model(x) | BinaryCodes(model)(x)], from forward_branches' one pass
    or, for a backbone without it, from its forward and forward_hashing."""
    torch.manual_seed(0)
    model = VPRModel(SideAdapterViT(VIT, hashing=True, **TINY), functools.partial(SelaVPRpp, out_dim=24, hashing=True,
                                                                                   bits=16)).eval()
    _randomise_adapters(model.backbone.adapters, 6)
    _randomise_adapters(model.backbone.adapters_hashing, 7)
    if not one_pass:
        model.backbone.forward_branches = None  # a backbone with a hashing path but no two-branch forward
    images = torch.randn(3, 3, 28, 28)
    both = BinaryCodes(model, with_descriptors=True)
    with torch.no_grad():
        rows = both(images).numpy()
        descriptors, codes = both.split(rows)
        np.testing.assert_allclose(descriptors, model(images).numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(codes, pack_codes(BinaryCodes(model)(images).numpy()))
