"""WiSE-FT weight ensembling (aggzoo.training.weight_ensembling) in real runs: the checkpoint records the
weights before the first step (after the head's k-means initialisation), every model reader gets
``(1 - alpha) * start + alpha * trained``, training and resuming see the fine-tuned weights, and
``alpha = 1`` changes nothing."""

from __future__ import annotations

import functools
from pathlib import Path

import lightning.pytorch as L
import pytest
import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from train_helpers import TINY, compose_train, tiny_fit_parts

import aggzoo
from aggzoo.data.transforms import eval_transform
from aggzoo.errors import CheckpointError
from aggzoo.hub.checkpoint import read_checkpoint
from aggzoo.hub.ensembling import ENSEMBLING_KEY, ensembled_state
from aggzoo.models.backbones.timm_backbone import TimmBackbone
from aggzoo.models.heads.netvlad import NetVLAD
from aggzoo.models.vpr_model import VPRModel
from aggzoo.run.pipeline import train
from aggzoo.training.callbacks import HeadDataInit
from aggzoo.training.weight_ensembling import WeightEnsembling


class _FirstStepWeights(L.Callback):
    """The model's weights as the first optimiser step sees them: an expectation independent of the
    callback under test (which keeps them at train start)."""

    def __init__(self) -> None:
        self.weights: dict[str, torch.Tensor] | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.weights is None:
            self.weights = {k: v.detach().clone() for k, v in pl_module.model.state_dict().items()}


def _fit(tiny_data, tmp_path: Path, alpha: float) -> tuple[VPRModel, dict[str, torch.Tensor], torch.Tensor, Path]:
    torch.manual_seed(0)
    model = VPRModel(TimmBackbone("test_resnet", out_indices=(3,)), functools.partial(NetVLAD, num_clusters=4))
    random_centroids = model.head.centroids.detach().clone()
    module, data = tiny_fit_parts(model, tiny_data.gsv, lr=1e-2)
    first = _FirstStepWeights()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=3, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path,
                        callbacks=[HeadDataInit(num_images=8, descriptors_per_image=8, seed=0),
                                   WeightEnsembling(alpha), first])
    trainer.fit(module, datamodule=data)
    path = tmp_path / "run.ckpt"
    trainer.save_checkpoint(path)
    return model, first.weights, random_centroids, path


def test_checkpoint_readers_get_the_mix_of_the_start_and_the_trained_weights(tiny_data, tmp_path: Path) -> None:
    alpha = 0.25
    model, start, random_centroids, path = _fit(tiny_data, tmp_path, alpha)
    stored = read_checkpoint(path)
    assert stored.ensembling_alpha == alpha
    # The start is after the k-means initialisation (not the random centres), before any step.
    assert not torch.equal(start["head.centroids"], random_centroids)
    trained = model.state_dict()
    assert stored.state_dict(ensembled=False).keys() == trained.keys()
    mixed = stored.state_dict()
    changed = 0
    for key, value in trained.items():
        if value.is_floating_point():
            expected = (1 - alpha) * start[key] + alpha * value
            torch.testing.assert_close(mixed[key], expected, atol=1e-6, rtol=1e-6, msg=key)
            changed += not torch.equal(start[key], value)
        else:  # BatchNorm's num_batches_tracked: as trained
            assert torch.equal(mixed[key], value), key
    assert changed > 0  # the three steps did move the weights: the mix is not the start nor the end
    # Lightning's own state (what a resumed run continues from) is the fine-tuned model.
    raw = torch.load(path, weights_only=True, map_location="cpu")["state_dict"]
    for key, value in trained.items():
        assert torch.equal(raw[f"model.{key}"], value), key


def test_alpha_one_records_nothing(tiny_data, tmp_path: Path) -> None:
    model, _, _, path = _fit(tiny_data, tmp_path, 1.0)
    stored = read_checkpoint(path)
    assert stored.ensembling_alpha is None and ENSEMBLING_KEY not in stored.contents
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in stored.state_dict().items())


@pytest.mark.parametrize(("record", "message"), [
    ({"alpha": 1.5, "start": {"w": torch.zeros(2)}}, r"alpha must be a number in \[0, 1\]"),
    ({"alpha": True, "start": {"w": torch.zeros(2)}}, r"alpha must be a number in \[0, 1\]"),
    ({"alpha": 0.5}, "exactly 'alpha' and 'start'"),
    ({"alpha": 0.5, "start": {"x": torch.zeros(2)}}, "keys the model lacks"),
    ({"alpha": 0.5, "start": {"w": torch.zeros(3)}}, r"shape \(3,\), the model \(2,\)"),
    ({"alpha": 0.5, "start": {"w": "code"}}, "map parameter names to tensors"),
])
def test_malformed_records_are_refused(record: dict, message: str) -> None:
    with pytest.raises(CheckpointError, match=message):
        ensembled_state({"w": torch.ones(2)}, record, where="x.ckpt")
    with pytest.raises(ValueError, match=r"alpha must be a number in \[0, 1\]"):
        WeightEnsembling(-0.1)


def test_pipeline_tests_and_readers_use_the_ensemble_and_a_resume_keeps_the_start(
        tiny_data, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGGZOO_DATA", str(tiny_data.root))
    run = [*TINY, "head=netvlad", "++head.num_clusters=4", "data.places_per_batch=6", "evaluate_baseline=false",
           "callbacks.weight_ensembling.alpha=0.5"]
    logs = tmp_path / "logs"
    first = train(compose_train([*run, "trainer.max_epochs=1", f"paths.log_dir={logs}"], tmp_path / "run"))
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    saved = torch.load(last, weights_only=True, map_location="cpu")
    start, first_step = saved[ENSEMBLING_KEY]["start"], saved["global_step"]
    # The test row of the run is the ensemble: the same recall as the model create_model builds from the file.
    best = Path(first["best_checkpoint"])
    model = aggzoo.create_model(str(best))
    expected = read_checkpoint(best).state_dict()
    assert all(torch.equal(v, expected[k]) for k, v in model.state_dict().items())
    assert not all(torch.equal(v, read_checkpoint(best).state_dict(ensembled=False)[k])
                   for k, v in model.state_dict().items() if v.is_floating_point())
    from aggzoo.evaluation.loop import evaluate_retrieval
    from aggzoo.evaluation.options import EvaluationOptions
    from aggzoo.run.benchmark_config import load_benchmarks

    cfg = compose_train([*run, f"paths.log_dir={logs}"], tmp_path / "check")
    (name, retrieval_set), = load_benchmarks(cfg.test_benchmarks).items()
    (tested,) = first["test"]
    norm = getattr(model.backbone, "pretrained_cfg", {}) or {}
    transform = eval_transform(tuple(cfg.data.eval_image_size), mean=norm.get("mean", IMAGENET_DEFAULT_MEAN),
                               std=norm.get("std", IMAGENET_DEFAULT_STD))
    again = evaluate_retrieval(model, retrieval_set, transform, EvaluationOptions(ks=tuple(cfg.recall_ks)))
    assert tested.name == name and tested.recalls == again.recalls
    # Resuming for a second epoch keeps the recorded start (not the resumed, trained weights).
    train(compose_train([*run, "trainer.max_epochs=2", f"paths.log_dir={logs}", f"ckpt_path={last}"], tmp_path / "r"))
    resumed = torch.load(last, weights_only=True, map_location="cpu")
    assert resumed["global_step"] > first_step
    for key, value in start.items():
        assert torch.equal(resumed[ENSEMBLING_KEY]["start"][key], value), key
