"""The revisited Oxford/Paris protocol end to end: ``eval.py`` on a folder in the published layout (real JPEGs, a
real ``gnd_roxford5k.pkl``) prints Easy / Medium / Hard mAP and mP@{1,5,10}, and the figures equal the protocol
computed here from the saved descriptors by a full brute-force ranking (queries cropped to their box)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from revisitop_files import GND, write_r1m, write_revisitop
from robustness.entry_helpers import run_entry

from aggzoo.data.retrieval_set import GroundTruth
from aggzoo.evaluation.metrics.revisited import revisited_metrics

pytestmark = pytest.mark.slow


def _setups() -> dict[str, GroundTruth]:
    """Easy / Medium / Hard as the revisitop README defines them, from the test folder's GND."""
    def arrays(*keys: str) -> tuple[np.ndarray, ...]:
        return tuple(np.array(sorted({i for k in keys for i in g[k]}), dtype=np.int64) for g in GND)

    return {"easy": GroundTruth(arrays("easy"), arrays("junk", "hard")),
            "medium": GroundTruth(arrays("easy", "hard"), arrays("junk")),
            "hard": GroundTruth(arrays("hard"), arrays("junk", "easy"))}


def test_eval_py_prints_and_records_the_revisited_metrics(tmp_path: Path) -> None:
    root = write_revisitop(tmp_path / "roxford5k")
    out = tmp_path / "run"
    result = run_entry(["model=netvlad_efficientnet_lite0.synthetic", "benchmark=roxford5k",
                        f"benchmark.roxford5k.root={root}", "evaluation.outputs.save_descriptors=true",
                        "evaluation.outputs.save_predictions=true", f"hydra.run.dir={out}"], tmp_path, script="eval.py")
    assert result.returncode == 0, result.stderr[-3000:]
    header = next(line for line in result.stdout.splitlines() if line.startswith("benchmark") and "setup" in line)
    for column in ("mAP (%)", "mP@1 (%)", "mP@5 (%)", "mP@10 (%)"):
        assert column in header
    for setup in ("easy", "medium", "hard"):
        assert any(line.split()[:2] == ["roxford5k", setup] for line in result.stdout.splitlines())
    recorded = json.loads((out / "results.json").read_text())["results"][0]
    descriptors = np.load(out / "descriptors_roxford5k.npz")
    # the full ranking of every database image, by inner product, ties by index (the protocol's exact search)
    scores = descriptors["queries"].astype(np.float64) @ descriptors["database"].astype(np.float64).T
    ranking = np.lexsort((np.broadcast_to(np.arange(scores.shape[1]), scores.shape), -scores), axis=1)
    assert np.array_equal(np.load(out / "predictions_roxford5k.npy"), ranking)
    expected = revisited_metrics(ranking, _setups(), (1, 5, 10))
    for setup, values in expected.items():
        assert recorded["metrics"][f"{setup}/mAP"] == pytest.approx(values["map"], abs=1e-12)
        for k in (1, 5, 10):
            assert recorded["metrics"][f"{setup}/mP@{k}"] == pytest.approx(values[f"mp@{k}"], abs=1e-12)
    assert recorded["metric_queries"]["easy"]["left_out"] == 1  # query 1 has no easy positive


def test_the_query_box_is_applied_before_the_descriptor(tmp_path: Path) -> None:
    """Query 0's box holds a different region than its whole 200x120 image: its descriptor is that of the crop."""
    root = write_revisitop(tmp_path / "roxford5k")
    whole = tmp_path / "whole"
    whole_root = write_revisitop(whole / "roxford5k")
    gnd_path = whole_root / "gnd_roxford5k.pkl"
    with gnd_path.open("rb") as file:
        gnd = pickle.load(file)
    gnd["gnd"][0]["bbx"] = np.array([0.0, 0.0, 200.0, 120.0])  # the whole image
    with gnd_path.open("wb") as file:
        pickle.dump(gnd, file)
    runs = {}
    for name, folder in (("cropped", root), ("whole", whole_root)):
        out = tmp_path / name
        result = run_entry(["model=netvlad_efficientnet_lite0.synthetic", "benchmark=roxford5k",
                            f"benchmark.roxford5k.root={folder}", "evaluation.outputs.save_descriptors=true",
                            "evaluation.outputs.pictures=false", f"hydra.run.dir={out}"], tmp_path, script="eval.py")
        assert result.returncode == 0, result.stderr[-3000:]
        runs[name] = np.load(out / "descriptors_roxford5k.npz")["queries"]
    assert not np.allclose(runs["cropped"][0], runs["whole"][0], atol=1e-3)
    np.testing.assert_allclose(runs["cropped"][1:], runs["whole"][1:], atol=1e-6)


def test_r1m_distractors_join_the_database(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_revisitop(data / "roxford5k")
    write_r1m(data / "revisitop1m", ["0/00/distractor_a", "0/00/distractor_b", "0/01/distractor_c"])
    out = tmp_path / "run"
    result = run_entry(["model=netvlad_efficientnet_lite0.synthetic", "benchmark=roxford5k_r1m",
                        f"paths.data_root={data}", "evaluation.outputs.pictures=false", f"hydra.run.dir={out}"],
                       tmp_path, script="eval.py")
    assert result.returncode == 0, result.stderr[-3000:]
    recorded = json.loads((out / "results.json").read_text())["results"][0]
    assert recorded["num_database"] == 8 + 3
    assert {"easy/mAP", "medium/mAP", "hard/mAP"} <= set(recorded["metrics"])
