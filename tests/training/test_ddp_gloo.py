"""Two CPU processes under Lightning DDP (gloo) train exactly what one process trains: the sampler
splits every P-place batch across the ranks, the loss sees the gathered global batch, and the
validation descriptors are gathered back before Recall@k.

One ``python train.py trainer=ddp_cpu`` subprocess (Lightning re-launches train.py for rank 1)
against the same config run in this process.
"""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as L
import pytest
import torch
from train_helpers import TINY, compose_train, logged, run_dirs, train_py

from aggzoo.hub.builder import build_model
from aggzoo.run.model_by_name import model_spec
from aggzoo.run.pipeline import train

# test_vit: LayerNorm only, so no batch statistics differ between one process and two half batches.
RUN = [*TINY, "backbone=test_vit", "head=gem", "data.places_per_batch=8", "trainer.max_epochs=1",
       "trainer.limit_train_batches=2", "evaluate_baseline=false", "benchmark@test_benchmarks=[]", "seed=3"]


def test_two_gloo_processes_match_one_process(tiny_data, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ddp = train_py([*RUN, "trainer=ddp_cpu", f"paths.log_dir={tmp_path / 'ddp'}"], tiny_data.root, timeout=300)
    assert ddp.returncode == 0, ddp.stdout[-3000:] + ddp.stderr[-3000:]
    assert "Starting with 2 processes" in ddp.stdout + ddp.stderr
    (ddp_dir,) = run_dirs(tmp_path / "ddp")

    monkeypatch.setenv("AGGZOO_DATA", str(tiny_data.root))
    cfg = compose_train([*RUN, f"paths.log_dir={tmp_path / 'single'}"], tmp_path / "single")
    single = train(cfg)
    assert single["trainer"].world_size == 1

    one = torch.load(tmp_path / "single" / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")
    two = torch.load(ddp_dir / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")
    assert one["global_step"] == two["global_step"] == 2
    L.seed_everything(cfg.seed, verbose=False)
    initial = build_model(model_spec(cfg)).state_dict()
    moved = max((one["state_dict"][f"model.{k}"] - v).abs().max().item() for k, v in initial.items())
    assert moved > 1e-4  # training changed the weights...
    for key, value in one["state_dict"].items():  # ...identically in both runs
        torch.testing.assert_close(two["state_dict"][key], value, atol=1e-6, rtol=1e-5, msg=key)
    # Same losses step by step (the rank-0 log of the DDP run holds the global-batch loss).
    single_loss, ddp_loss = logged(tmp_path / "single", "train/loss"), logged(ddp_dir, "train/loss")
    assert single_loss.keys() == ddp_loss.keys() and len(single_loss) == 2
    for step, value in single_loss.items():
        assert abs(ddp_loss[step] - value) < 1e-5
    # Validation on gathered descriptors: the same Recall@k as one process.
    for k in (1, 5, 10):
        key = f"val/synthetic_val/R@{k}"
        assert logged(ddp_dir, key) == logged(tmp_path / "single", key) != {}
