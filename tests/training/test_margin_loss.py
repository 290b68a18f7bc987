"""Margin losses (ArcFace, CosFace, sub-center ArcFace of pytorch-metric-learning) as loss configs: their values
against the papers' formulas (margins in the configs' stated units), their class weights in their own optimiser
group, sized from the data, saved in checkpoints and resumed with their optimiser state, and absent from the
retrieval model a checkpoint exports."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from omegaconf import OmegaConf
from safetensors.torch import load_file
from train_helpers import CONF, TINY, compose_train, logged, run_dirs, train_py

from aggzoo.errors import ConfigError
from aggzoo.models.backbones.timm_backbone import TimmBackbone
from aggzoo.models.heads.gem import GeM
from aggzoo.models.vpr_model import VPRModel
from aggzoo.run.pipeline import build_loss, train
from aggzoo.training.losses import MarginLoss
from aggzoo.training.module import VPRLightningModule

EMBEDDING, CLASSES = 8, 5


class _Classes:
    """A training set as build_loss sees it: only its number of classes."""

    num_classes = CLASSES


class _Sized:
    out_dim = EMBEDDING


def _loss(name: str) -> MarginLoss:
    torch.manual_seed(0)
    return build_loss(OmegaConf.load(CONF / "loss" / f"{name}.yaml"), _Classes(), _Sized())


def _cosines(x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    return F.normalize(x, dim=1) @ F.normalize(weights, dim=0)  # [N, D] x [D, C'] -> [N, C']


def _cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return (torch.logsumexp(logits, dim=1) - logits.gather(1, labels[:, None]).squeeze(1)).mean()


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(12, EMBEDDING, generator=generator), torch.arange(12) % CLASSES


def test_arcface_is_the_papers_loss_with_the_margin_in_radians() -> None:
    loss = _loss("arcface")
    x, labels = _batch()
    cos = _cosines(x, loss.loss.W)
    theta = torch.acos(cos.gather(1, labels[:, None]).clamp(-1, 1))
    assert bool((theta + 0.5 < math.pi).all())  # the monotonic branch of the formula
    logits = cos.scatter(1, labels[:, None], torch.cos(theta + 0.5))  # m = 0.5 rad (paper), config in degrees
    torch.testing.assert_close(loss(x, labels), _cross_entropy(64.0 * logits, labels))
    assert tuple(loss.loss.W.shape) == (EMBEDDING, CLASSES)


def test_cosface_is_the_papers_loss() -> None:
    loss = _loss("cosface")
    x, labels = _batch()
    cos = _cosines(x, loss.loss.W)
    logits = cos - 0.35 * F.one_hot(labels, CLASSES)
    torch.testing.assert_close(loss(x, labels), _cross_entropy(64.0 * logits, labels))


def test_subcenter_arcface_takes_the_closest_of_three_centres() -> None:
    loss = _loss("subcenter_arcface")
    x, labels = _batch()
    assert tuple(loss.loss.W.shape) == (EMBEDDING, CLASSES * 3)
    cos = _cosines(x, loss.loss.W).view(-1, CLASSES, 3).amax(dim=2)  # class c owns columns 3c .. 3c+2
    theta = torch.acos(cos.gather(1, labels[:, None]).clamp(-1, 1))
    logits = cos.scatter(1, labels[:, None], torch.cos(theta + 0.5))
    torch.testing.assert_close(loss(x, labels), _cross_entropy(64.0 * logits, labels))


def test_delg_margin_is_a_tenth_of_a_radian(tmp_path: Path) -> None:
    for recipe in ("delg_gem_resnet101_gldv2", "landmarks_arcface_quick"):
        cfg = compose_train([f"experiment={recipe}"], tmp_path)
        arcface = instantiate(cfg.loss.loss)(num_classes=3, embedding_size=4)
        assert arcface.margin == pytest.approx(0.1, abs=1e-6) and arcface.scale == pytest.approx(math.sqrt(2048), abs=0.01)


def test_the_class_weights_train_in_their_own_group_with_their_lr_and_weight_decay() -> None:
    torch.manual_seed(0)
    model = VPRModel(TimmBackbone("test_resnet", out_indices=(3,)), functools.partial(GeM, whiten=EMBEDDING))
    node = OmegaConf.load(CONF / "loss" / "arcface.yaml")
    node.lr_multiplier, node.weight_decay = 10.0, 1e-3
    loss = build_loss(node, _Classes(), model)
    module = VPRLightningModule(model, loss=loss, optimizer=functools.partial(torch.optim.SGD, lr=0.01,
                                                                             weight_decay=5e-4))
    optimizer = module.configure_optimizers()
    groups = {g["name"]: g for g in optimizer.param_groups}
    (weights,) = groups["loss"]["params"]
    assert weights is loss.loss.W and tuple(weights.shape) == (model.out_dim, CLASSES)
    assert groups["loss"]["lr"] == pytest.approx(0.1) and groups["loss"]["weight_decay"] == pytest.approx(1e-3)
    model_params = {id(p) for p in model.parameters() if p.requires_grad}
    in_other_groups = {id(p) for name, g in groups.items() if name != "loss" for p in g["params"]}
    assert in_other_groups == model_params  # every model weight elsewhere, the class weights only in "loss"
    assert groups["lr_x1"]["lr"] == pytest.approx(0.01) and groups["lr_x1"]["weight_decay"] == pytest.approx(5e-4)


def test_a_margin_loss_needs_class_labelled_data() -> None:
    class Places:  # no num_classes: GSV-Cities places
        pass

    with pytest.raises(ConfigError, match="needs a class-labelled training set"):
        build_loss(OmegaConf.load(CONF / "loss" / "arcface.yaml"), Places(), _Sized())


# Tiny landmark run: 10 classes of the tiny set (seed 1) / P = 2 -> 5 steps per epoch; a checkpoint every step.
LANDMARKS = [*TINY, "experiment=landmarks_arcface_quick", "synthetic_landmarks=tiny", "+head.whiten=16",
             "data.places_per_batch=2", "data.image_size=[32,48]", "data.eval_image_size=[32,48]",
             "trainer.max_epochs=2", "evaluate_baseline=false", "+callbacks.model_checkpoint.every_n_train_steps=1",
             "seed=5"]
KILL_AT = 7  # the newest checkpoint is step 6: batch 1 of epoch 1


def test_killed_margin_run_resumes_to_the_uninterrupted_result_and_exports_no_class_weights(
        tiny_data, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import aggzoo

    logs = tmp_path / "logs"
    killed = train_py([*LANDMARKS, f"paths.log_dir={logs}", "+callbacks.crash._target_=faults.KillAtStep",
                       f"+callbacks.crash.step={KILL_AT}"], tiny_data.root)
    assert killed.returncode == -9, killed.stderr[-3000:]
    (run,) = run_dirs(logs)
    state = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")
    assert state["global_step"] == KILL_AT - 1 and state["epoch"] == 1

    monkeypatch.setenv("AGGZOO_DATA", str(tiny_data.root))
    train(compose_train([*LANDMARKS, f"paths.log_dir={logs}", "ckpt_path=last"], tmp_path / "resumed"))
    straight = train(compose_train([*LANDMARKS, f"paths.log_dir={tmp_path / 'straight_logs'}"], tmp_path / "straight"))

    final = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")
    reference = torch.load(tmp_path / "straight" / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")
    assert final["global_step"] == reference["global_step"] == 10
    weights = reference["state_dict"]["loss.loss.W"]
    assert tuple(weights.shape) == (16, 10)  # [D, classes of the tiny seed-1 set]
    assert final["state_dict"].keys() == reference["state_dict"].keys()
    for key, value in reference["state_dict"].items():
        torch.testing.assert_close(final["state_dict"][key], value, atol=0, rtol=0, msg=key)
    ours, theirs = final["optimizer_states"][0], reference["optimizer_states"][0]
    assert [g["name"] for g in theirs["param_groups"]][-1] == "loss"
    (loss_index,) = theirs["param_groups"][-1]["params"]
    assert ours["state"].keys() == theirs["state"].keys() and loss_index in theirs["state"]
    for index, entry in theirs["state"].items():
        torch.testing.assert_close(ours["state"][index]["momentum_buffer"], entry["momentum_buffer"], atol=0, rtol=0)
    assert final["lr_schedulers"] == reference["lr_schedulers"]
    assert logged(run, "train/loss") == logged(tmp_path / "straight", "train/loss")

    # The retrieval model of the checkpoint: the model's weights only, no class weights.
    model = aggzoo.create_model(straight["best_checkpoint"])
    assert set(model.state_dict()) == {k[len("model."):] for k in reference["state_dict"] if k.startswith("model.")}
    folder = aggzoo.save_pretrained(model, tmp_path / "exported")
    saved = load_file(str(Path(folder) / "model.safetensors"))
    assert saved.keys() == model.state_dict().keys() and not any("loss" in k for k in saved)
    assert not any(tuple(t.shape) == tuple(weights.shape) for t in saved.values())
