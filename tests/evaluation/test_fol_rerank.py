"""``eval.py model=<tiny FoL twin> benchmark=nordland_mini evaluation.rerank.method=fol`` on the real images
(skipped where the shared data is absent): the re-ranked predictions equal a brute-force re-scoring of the same
global shortlist by FoL's rule, written here from the authors' ``test_FoL.py`` (for each query feature its best
database feature; a match when that one's best query feature is it and their cosine exceeds 0.7; most matches
first, ties in first-stage order)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra_helpers import compose_run_config
from PIL import Image

import aggzoo
from aggzoo.evaluation.options import SearchOptions
from aggzoo.evaluation.protocol import protocol_transform
from aggzoo.evaluation.search import search
from aggzoo.hub.cfg import PretrainedCfg
from aggzoo.run.benchmark_config import load_benchmark
from aggzoo.run.evaluate import evaluate

SIDE = 70  # 5 x 5 patches -> 17 x 17 local locations
TOP_K = 100
HEAD = {"num_clusters": 8, "cluster_dim": 16, "token_dim": 16, "num_selected": 10, "local_dim": 16}
TWIN = {"depth": 2, "embed_dim": 64, "num_heads": 2, "frozen_stages": 0}


def _scores(query: np.ndarray, candidates: np.ndarray) -> list[int]:
    out = []
    for candidate in candidates:
        sims = candidate @ query.T                     # [M, L]
        best_db = sims.argmax(axis=0)                  # each query feature's best database feature
        best_query = sims.argmax(axis=1)               # each database feature's best query feature
        out.append(sum(int(best_query[i] == j and sims[i, j] > 0.7) for j, i in enumerate(best_db)))
    return out


@pytest.mark.slow  # 2 x 1292 real images, extracted twice
def test_fol_rerank_on_nordland_mini_equals_brute_force(nordland_mini: Path, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = aggzoo.create_model("fol_dinov2_vitb14", backbone_kwargs=TWIN, **HEAD).eval()
    cfg = PretrainedCfg(architecture="fol_dinov2_vitb14", tag="tiny", input_size=(3, SIDE, SIDE),
                        interpolation="bilinear", eval_metric="l2", out_dim=model.out_dim)
    saved = aggzoo.save_pretrained(model, tmp_path / "twin", pretrained_cfg=cfg)
    out = tmp_path / "run"
    (result,) = evaluate(compose_run_config("eval", [
        f"model={saved}", "benchmark=nordland_mini", f"paths.shared_data={nordland_mini.parent}",
        "evaluation.rerank.method=fol", "evaluation.outputs.save_predictions=true",
        "evaluation.outputs.save_descriptors=true", "evaluation.outputs.pictures=false"], out))
    reranked = np.load(out / "predictions_nordland_mini.npy")
    descriptors = np.load(out / "descriptors_nordland_mini.npz")
    written = json.loads((out / "results.json").read_text())["results"][0]
    assert reranked.shape == (1292, TOP_K)

    # The same shortlist: the first stage's L2 search (the weights' protocol) of the saved descriptors.
    shortlist = search(descriptors["database"], descriptors["queries"], TOP_K, SearchOptions(metric="l2"))
    assert (np.sort(shortlist, 1) == np.sort(reranked, 1)).all()

    # Local features of every image, extracted here with the protocol's own transform.
    benchmark = load_benchmark(compose_run_config("eval", ["benchmark=nordland_mini",
                                                           f"paths.shared_data={nordland_mini.parent}"], tmp_path / "b")
                               .benchmark.nordland_mini)
    transform = protocol_transform((SIDE, SIDE), multiple=14, interpolation="bilinear")

    def local(paths: tuple) -> np.ndarray:
        rows = []
        with torch.no_grad():
            for start in range(0, len(paths), 128):
                batch = torch.stack([transform(np.asarray(Image.open(p).convert("RGB")))
                                     for p in paths[start:start + 128]])
                rows.append(model.head.local_features(model.backbone(batch)).numpy())
        return np.concatenate(rows)

    database, queries = local(benchmark.database_paths), local(benchmark.query_paths)
    assert database.shape[1:] == (10 * 16, 16)  # 10 patches x 4 x 4 locations, 16-D
    changed = 0
    for q in range(len(queries)):
        scores = _scores(queries[q], database[shortlist[q]])
        expected = [d for _, _, d in sorted(zip((-s for s in scores), range(TOP_K), shortlist[q]))]
        np.testing.assert_array_equal(reranked[q], expected, err_msg=f"query {q}")
        changed += int(expected[0] != shortlist[q, 0])
    assert changed > 0  # the second stage moved some first results
    stats = result.extras["rerank"]
    assert stats["method"] == "fol" and stats["top_k"] == TOP_K and stats["min_similarity"] == 0.7
    assert stats["local_features"] == [10 * 16, 16]
    positives = benchmark.positives
    first = np.mean([np.isin(shortlist[q, 0], positives[q]) for q in range(len(queries))])
    assert stats["first_stage_recalls"]["1"] == pytest.approx(first)
    assert written["num_queries"] == 1292
    print(f"nordland_mini tiny FoL twin: R@1 first stage {100 * first:.2f}, re-ranked {100 * result.recalls[1]:.2f}")
