"""SelaVPR against independent expectations: the global descriptor by hand, the local features' size
and norm, the adapted ViT at initialisation against timm's forward, mutual nearest neighbours by brute
force, and the re-ranking end to end on real image files."""

from __future__ import annotations

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
from aggzoo.evaluation.local_rerank import MutualNNRerank, evaluate_with_local_rerank, mutual_nn_counts
from aggzoo.evaluation.options import EvaluationOptions, ExtractionOptions, OutputOptions, RerankOptions
from aggzoo.layers.pooling import gem
from aggzoo.models.backbones.sela_adapter import SelaAdapterViT
from aggzoo.models.backbones.timm_backbone import TimmBackbone
from aggzoo.models.features import Features
from aggzoo.models.heads.gem import GeM
from aggzoo.models.heads.selavpr import SelaVPR
from aggzoo.models.vpr_model import VPRModel

TINY = {"depth": 2, "embed_dim": 64, "num_heads": 2, "dynamic_img_size": True}


def test_global_descriptor_by_hand_and_local_feature_grid() -> None:
    head = SelaVPR(32, local_hidden=16, local_dim=8).eval()
    with torch.no_grad():
        head.gem.p.fill_(2.2)
    x = torch.randn(2, 32, 5, 7, generator=torch.Generator().manual_seed(0))
    expected = F.normalize(gem(F.normalize(x, dim=1), 2.2), dim=1)
    torch.testing.assert_close(head(Features((x,))), expected)
    local = head.local_features(Features((x,)))
    # Two stride-2 transposed 3x3 convolutions with padding 1: n -> 2n - 1 -> 4n - 3 (16 -> 61 at 224 px).
    assert local.shape == (2, 17, 25, 8)
    torch.testing.assert_close(local.norm(dim=-1), torch.ones(2, 17, 25))
    assert not any(p.requires_grad for p in head.local_adapt.parameters())  # needs SelaVPR's local loss


def test_adapted_vit_at_initialisation_is_the_pretrained_vit() -> None:
    torch.manual_seed(0)
    adapted = SelaAdapterViT("vit_small_patch14_reg4_dinov2", **TINY).eval()
    plain = TimmBackbone("vit_small_patch14_reg4_dinov2", **TINY).eval()
    plain.model.load_state_dict(adapted.model.state_dict())
    images = torch.randn(2, 3, 56, 42)
    with torch.no_grad():
        a, b = adapted(images), plain(images)
    torch.testing.assert_close(a.last, b.last)
    torch.testing.assert_close(a.cls, b.cls)
    # Serial adapter on: the attention output a becomes a + fc2(ReLU(fc1(a))), which changes the map.
    with torch.no_grad():
        adapted.adapters[0].adapter1.D_fc2.weight.normal_()
        assert (adapted(images).last - b.last).abs().max() > 1e-6  # timm inits layer scale at 1e-5


def _brute_force_counts(query: np.ndarray, candidate: np.ndarray) -> int:
    sims = query @ candidate.T  # [L, M]
    return sum(int(np.argmax(sims[:, np.argmax(sims[i])]) == i) for i in range(len(query)))


def test_mutual_nn_counts_equal_a_brute_force_loop() -> None:
    gen = np.random.default_rng(0)
    def unit(a: np.ndarray) -> np.ndarray:
        return (a / np.linalg.norm(a, axis=-1, keepdims=True)).astype(np.float32)

    query = unit(gen.standard_normal((30, 8)))
    candidates = unit(gen.standard_normal((5, 40, 8)))
    candidates[3, :30] = query  # a candidate holding the query's (unit) features: all 30 are mutual
    counts = mutual_nn_counts(torch.from_numpy(query), torch.from_numpy(candidates)).numpy()
    assert counts.tolist() == [_brute_force_counts(query, c) for c in candidates] and counts[3] == 30


def test_rerank_reorders_only_the_shortlist_and_keeps_ties_in_order() -> None:
    gen = np.random.default_rng(1)
    database = gen.standard_normal((6, 20, 4)).astype(np.float32)
    database /= np.linalg.norm(database, axis=-1, keepdims=True)
    queries = np.stack([database[4], database[1]])
    database[5] = database[0]  # two identical candidates: a tie, first-stage order kept
    predictions = np.array([[0, 5, 4, 2, 3, 1], [5, 0, 2, 3, 1, 4]])
    out = MutualNNRerank(top_k=3)(queries, database, predictions)
    assert out[0, 0] == 4 and out[0, 1:3].tolist() == [0, 5] and out[0, 3:].tolist() == [2, 3, 1]
    # The second query's own image (1) is not in its top 3: sorted by brute-force counts (a stable sort).
    expected = sorted(predictions[1, :3], key=lambda d: -_brute_force_counts(queries[1], database[d]))
    assert out[1, :3].tolist() == expected and out[1, 3:].tolist() == predictions[1, 3:].tolist()


def test_evaluate_with_local_rerank_on_image_files(tmp_path: Path) -> None:
    top_k = 3
    paths = write_noise_images(tmp_path, 6, (42, 42, 3), seed=2, high=255)
    # Queries are copies of database images 2 and 4: identical local features, all mutual.
    retrieval_set = RetrievalSet("tiny", tuple(paths[:5]), (paths[2], paths[4]), (np.array([2]), np.array([4])))
    torch.manual_seed(0)
    model = VPRModel(SelaAdapterViT("vit_small_patch14_dinov2", **TINY), functools.partial(SelaVPR, local_hidden=8, local_dim=8))

    def transform(rgb: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(rgb).permute(2, 0, 1).float() / 255.0

    result = evaluate_with_local_rerank(model, retrieval_set, transform, EvaluationOptions(ks=(1, 2)),
                                        rerank=MutualNNRerank(top_k))
    assert result.recalls[1] == 1.0 and result.extras["rerank"]["top_k"] == top_k
    assert result.extras["rerank"]["local_features"] == [81, 8]  # 3 x 3 patches -> 9 x 9 locations
    assert result.extras["rerank"]["first_stage_recalls"]["1"] == 1.0
    # eval.py's way: evaluation.rerank.method=mutual_nn evaluation.rerank.k=3 through evaluate_benchmarks
    options = EvaluationOptions(ks=(1, 2), extraction=ExtractionOptions(batch_size=16),
                                rerank=RerankOptions(method="mutual_nn", k=top_k), outputs=OutputOptions(pictures=False))
    (by_config,) = evaluate_benchmarks(model, [retrieval_set], transform, options)
    np.testing.assert_array_equal(by_config.predictions, result.predictions)
    assert by_config.extras["rerank"]["top_k"] == top_k
    gem_model = VPRModel(TimmBackbone("test_resnet", out_indices=(3,)), functools.partial(GeM))
    with pytest.raises(ConfigError, match="head=selavpr"):
        evaluate_benchmarks(gem_model, [retrieval_set], transform,
                            EvaluationOptions(ks=(1,), rerank=RerankOptions(method="mutual_nn"),
                                              outputs=OutputOptions(pictures=False)))
