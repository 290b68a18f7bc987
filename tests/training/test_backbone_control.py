"""Backbone control in training: frozen stages record no graph, per-group learning rates, gradient
checkpointing, mixed precision with fp32 islands, torch.compile, RNG state round trip, and the
validation descriptor assembly."""

from __future__ import annotations

import functools

import lightning.pytorch as L
import numpy as np
import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from train_helpers import CONF

from aggzoo.models.backbones.timm_backbone import TimmBackbone
from aggzoo.models.heads.gem import GeM
from aggzoo.models.vpr_model import VPRModel
from aggzoo.training.module import (
    VPRLightningModule,
    enable_gradient_checkpointing,
    parameter_groups,
    rng_state,
    set_rng_state,
)


def _loss():
    return instantiate(OmegaConf.load(CONF / "loss" / "multisimilarity.yaml"))


def _module(model: VPRModel, **kwargs) -> VPRLightningModule:
    return VPRLightningModule(model, loss=_loss(), optimizer=functools.partial(torch.optim.AdamW, lr=1e-3), **kwargs)


def _resnet(frozen: int = 0) -> VPRModel:
    torch.manual_seed(0)
    return VPRModel(TimmBackbone("test_resnet", out_indices=(3,), frozen_stages=frozen), functools.partial(GeM))


def _vit(frozen: int = 0) -> VPRModel:
    torch.manual_seed(0)
    return VPRModel(TimmBackbone("test_vit", dynamic_img_size=True, frozen_stages=frozen), functools.partial(GeM))


def _batch(n: int = 8, size: tuple[int, int] = (64, 64)) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(n, 3, *size, generator=gen), torch.arange(n) // 2


def test_parameter_groups_apply_the_first_matching_multiplier_and_skip_frozen() -> None:
    model = _resnet(frozen=2)
    groups = parameter_groups(model, base_lr=0.1, lr_multipliers={"head.pool.p": 10.0, "backbone.*": 0.5},
                              no_weight_decay=["head.pool.p", "*.bn*"])
    by_name = {id(p): n for n, p in model.named_parameters()}
    where = {by_name[id(p)]: (g["lr"], g.get("weight_decay")) for g in groups for p in g["params"]}
    assert where["head.pool.p"] == (1.0, 0.0)
    assert where["backbone.model.layer3.0.conv1.weight"] == (0.05, None)
    assert where["backbone.model.layer3.0.bn1.weight"] == (0.05, 0.0)
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen and not frozen & where.keys()  # the stem and layer1 are frozen and left out
    assert set(where) == {n for n, p in model.named_parameters() if p.requires_grad}


def test_frozen_stages_record_no_graph_and_keep_their_statistics() -> None:
    model = _resnet(frozen=3)  # stem, layer1, layer2
    model.train()
    outputs = {}
    for name in ("layer1", "layer2", "layer3"):
        getattr(model.backbone.model, name).register_forward_hook(
            lambda mod, args, out, name=name: outputs.__setitem__(name, out))
    bn = model.backbone.model.layer2[0].bn1
    stats = bn.running_mean.clone()
    images, labels = _batch()
    _loss()(model(images), labels).backward()
    # No tensor of the frozen prefix requires grad, so autograd stored nothing for it (as under no_grad).
    assert not outputs["layer1"].requires_grad and not outputs["layer2"].requires_grad
    assert outputs["layer3"].requires_grad
    assert all(p.grad is None for n, p in model.named_parameters() if ".layer2." in n or ".layer1." in n)
    assert all(p.grad is not None for n, p in model.named_parameters() if ".layer3." in n)
    assert not bn.training and torch.equal(bn.running_mean, stats)


def _saved_tensors(fn) -> int:
    count = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal count
        count += 1
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return count


def _image_tokens() -> VPRModel:
    """ImAge: tokens inserted before block 2 of 6 (blocks 0-1 frozen); its own loop over the blocks."""
    from aggzoo.models.backbones.aggregation_tokens import AggregationTokenViT
    from aggzoo.models.heads.image import ImAgeTokens

    torch.manual_seed(0)
    backbone = AggregationTokenViT("test_vit", num_tokens=4, insert_before_block=2, dynamic_img_size=True)
    return VPRModel(backbone, functools.partial(ImAgeTokens, num_tokens=4))


def _lopa() -> VPRModel:
    """LoPA adapters beside a ViT whose last 4 blocks train (an integer frozen_stages); its own loop too."""
    from aggzoo.models.backbones.lopa import LoPAViT

    torch.manual_seed(0)
    return VPRModel(LoPAViT("test_vit", frozen_stages=2, dynamic_img_size=True), functools.partial(GeM))


@pytest.mark.parametrize("build", [functools.partial(_vit, frozen=2), _image_tokens, _lopa],
                         ids=["vit", "image", "lopa"])
def test_gradient_checkpointing_gives_the_same_gradients_and_stores_less(build) -> None:
    images, labels = _batch(4)
    results = []
    for checkpointing in (False, True):
        model = build()
        if checkpointing:
            assert enable_gradient_checkpointing(model)
        out = {}
        saved = _saved_tensors(lambda: out.setdefault("loss", _loss()(model(images), labels)))
        out["loss"].backward()
        results.append((saved, out["loss"].item(), {n: p.grad.clone() for n, p in model.named_parameters()
                                                    if p.grad is not None}))
    (saved_plain, loss_plain, grads_plain), (saved_ckpt, loss_ckpt, grads_ckpt) = results
    assert saved_ckpt < saved_plain / 2
    assert loss_ckpt == pytest.approx(loss_plain, abs=1e-6)
    assert grads_plain.keys() == grads_ckpt.keys() and len(grads_plain) > 10
    for name in grads_plain:
        torch.testing.assert_close(grads_ckpt[name], grads_plain[name], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("head_fp32", [False, True])
def test_bf16_autocast_step_is_finite_with_fp32_loss_and_head_option(head_fp32: bool) -> None:
    module = _module(_resnet(frozen=1), head_fp32=head_fp32)
    seen = {}
    module.model.head.register_forward_pre_hook(lambda mod, args: seen.__setitem__("dtype", args[0].last.dtype))
    images, labels = _batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        descriptors = module.describe(images)
        loss = module.loss(descriptors, labels)
    loss.backward()
    assert seen["dtype"] == (torch.float32 if head_fp32 else torch.bfloat16)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in module.model.parameters() if p.grad is not None)


def test_compile_keeps_outputs_and_state_dict_keys() -> None:
    images, _ = _batch(2)
    plain = _module(_resnet())
    compiled = _module(_resnet(), compile={"backend": "eager"})
    assert compiled.state_dict().keys() == plain.state_dict().keys()
    plain.eval(), compiled.eval()
    with torch.no_grad():
        torch.testing.assert_close(compiled(images), plain(images))


def test_rng_state_round_trips_through_a_weights_only_checkpoint(tmp_path) -> None:
    torch.manual_seed(5)
    np.random.seed(5)
    state = rng_state()
    expected = (torch.rand(3), np.random.rand(3))
    torch.save({"rng": state}, tmp_path / "c.ckpt")
    torch.manual_seed(99)
    np.random.seed(99)
    set_rng_state(torch.load(tmp_path / "c.ckpt", weights_only=True)["rng"])
    assert torch.equal(torch.rand(3), expected[0]) and np.array_equal(np.random.rand(3), expected[1])


def test_validation_rows_are_assembled_by_index_and_incomplete_sets_are_skipped() -> None:
    module = _module(_resnet())
    module.trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    rows = torch.randn(5, 3)
    parts = [(torch.tensor([3, 0]), rows[[3, 0]]), (torch.tensor([4, 1, 2]), rows[[4, 1, 2]])]
    torch.testing.assert_close(module._gather_rows(parts, 5), rows)
    assert module._gather_rows(parts[:1], 5) is None


def test_fit_keeps_frozen_stages_in_eval_mode(tiny_data) -> None:
    """Lightning does not call train() when fitting: the module applies the backbone's rule itself, so
    the frozen stages' batch-norm statistics do not move however the trainer is set up."""
    from aggzoo.data.gsv_cities import GSVCitiesDataset
    from aggzoo.data.transforms import eval_transform
    from aggzoo.training.datamodule import VPRDataModule

    module = _module(_resnet(frozen=3))
    dataset = GSVCitiesDataset(tiny_data.gsv, img_per_place=4, transform=eval_transform((32, 48)))
    data = VPRDataModule(train_dataset=dataset, val_sets={}, eval_transform=eval_transform((32, 48)),
                         places_per_batch=4)
    frozen_bn = module.model.backbone.model.layer2[0].bn1
    trainable_bn = module.model.backbone.model.layer3[0].bn1
    frozen_stats, trainable_stats = frozen_bn.running_mean.clone(), trainable_bn.running_mean.clone()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, limit_train_batches=2, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule=data)
    assert trainer.global_step == 2
    assert torch.equal(frozen_bn.running_mean, frozen_stats)
    assert not torch.equal(trainable_bn.running_mean, trainable_stats)
