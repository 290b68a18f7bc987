"""Distributed evaluation (issue 12, item 7): ``python eval.py trainer=ddp_cpu`` (two gloo processes, Lightning's
predict loop, one descriptor shard per rank, merged and searched as one index) gives the predictions and
recalls of one process; and the shard merge keeps every image exactly once, in order, whatever the sampler
padded."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler
from train_helpers import compose_train, train_py

import aggzoo
from aggzoo.hub.builder import build_model
from aggzoo.run.evaluate import evaluate
from aggzoo.run.model_by_name import model_spec
from aggzoo.training.sharded_extraction import _shard_paths, merge_shards

ARCHITECTURE = ["backbone=test_vit", "head=gem"]
RUN = ["synthetic=tiny", "image_size=[48,64]", "eval_batch_size=5", "evaluation.outputs.pictures=false",
       "evaluation.outputs.save_predictions=true"]


def test_two_gloo_processes_evaluate_as_one(tiny_data, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Fixed weights (a save_pretrained folder): each rank builds the model on its own, so an unseeded
    # random head would differ between the ranks and the comparison would test nothing.
    monkeypatch.setenv("AGGZOO_DATA", str(tiny_data.root))
    torch.manual_seed(0)
    spec = model_spec(compose_train([*RUN, *ARCHITECTURE], tmp_path / "spec", name="eval"))
    weights = aggzoo.save_pretrained(build_model(spec), tmp_path / "weights", spec=spec)
    run_args = [*RUN, f"ckpt_path={weights}"]  # the folder brings its architecture: no head=/backbone= beside it
    ddp = train_py([*run_args, "trainer=ddp_cpu", f"paths.log_dir={tmp_path / 'ddp'}"], tiny_data.root,
                   timeout=300, script="eval.py")
    assert ddp.returncode == 0, ddp.stdout[-3000:] + ddp.stderr[-3000:]
    assert "Starting with 2 processes" in ddp.stdout + ddp.stderr
    (run,) = (tmp_path / "ddp" / "eval" / "runs").glob("*")
    assert not (run / "descriptor_shards").exists()  # shards and merged files removed afterwards
    assert ddp.stdout.count("synthetic_test ") == 1  # rank 0 alone prints the table

    single = evaluate(compose_train([*run_args, f"paths.log_dir={tmp_path / 'one'}"], tmp_path / "one", name="eval"))
    two = np.load(run / "predictions_synthetic_test.npy")
    np.testing.assert_array_equal(two, single[0].predictions)
    recalls = json.loads((run / "results.json").read_text())["results"][0]["recalls"]
    assert recalls == {str(k): v for k, v in single[0].recalls.items()}


def test_merged_shards_hold_every_image_once_in_order_despite_padding(tmp_path: Path) -> None:
    n, d, world = 7, 3, 3
    rows = np.random.default_rng(0).standard_normal((n, d)).astype(np.float32)
    stem = tmp_path / "extract001"
    for rank in range(world):
        # torch's DistributedSampler pads 7 images to 9 with repeats of the first ones
        ids = np.array(list(DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=False)))
        rows_path, ids_path = _shard_paths(stem, rank)
        shard_ids = np.full(n, -1, dtype=np.int64)  # the writer's layout: written rows first, then -1
        shard_ids[:len(ids)] = ids
        shard_rows = np.zeros((n, d), np.float32)
        shard_rows[:len(ids)] = rows[ids]
        np.save(rows_path, shard_rows)
        np.save(ids_path, shard_ids)
    assert sum(len(DistributedSampler(range(n), num_replicas=world, rank=r)) for r in range(world)) == 9
    merged = merge_shards(stem, world, n, tmp_path / "merged.npy", np.dtype(np.float32))
    np.testing.assert_array_equal(np.asarray(merged), rows)
    assert not list(tmp_path.glob("extract001.rank*"))

    for rank in range(world):  # one rank's shard lost: refused, naming how many images are missing
        rows_path, ids_path = _shard_paths(stem, rank)
        np.save(rows_path, rows[rank::world] if rank else np.zeros((0, d), np.float32))
        np.save(ids_path, np.arange(n)[rank::world] if rank else np.zeros(0, np.int64))
    with pytest.raises(RuntimeError, match="miss 3 of 7 images"):
        merge_shards(stem, world, n, tmp_path / "merged2.npy", np.dtype(np.float32))
