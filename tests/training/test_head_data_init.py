"""The HeadDataInit callback in a real Lightning fit: GSP's prototypes from the pooled embeddings of
training images (greedy k-center, as upstream)."""

from __future__ import annotations

import functools

import lightning.pytorch as L
import torch
from train_helpers import tiny_fit_parts

from aggzoo.models.backbones.timm_backbone import TimmBackbone
from aggzoo.models.heads.gsp import GSP, greedy_k_center
from aggzoo.models.vpr_model import VPRModel
from aggzoo.training.callbacks import HeadDataInit

K = 8


def test_gsp_prototypes_are_greedy_k_centers_of_pooled_training_embeddings(tiny_data) -> None:
    torch.manual_seed(0)
    model = VPRModel(TimmBackbone("test_resnet", out_indices=(3,)),
                     functools.partial(GSP, embedding_dim=16, num_prototypes=K))
    before = model.head.prototypes.detach().clone()
    module, data = tiny_fit_parts(model, tiny_data.gsv, lr=1e-3)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=0, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[HeadDataInit(pooled_images=3 * K, seed=0)])
    trainer.fit(module, datamodule=data)
    assert trainer.global_step == 0

    # The same images, embedded by hand: 1x1 transform, spatial mean, the authors' x / max(|x|, 1).
    model.eval()
    weight = model.head.feature_transform.weight[:, :, 0, 0]  # [D, C]
    with torch.no_grad():
        images = torch.cat([batch for batch, _ in data.feature_sample_dataloader(3 * K, seed=0)])
        fmap = model.backbone(images).last  # [N, C, H, W]
        average = torch.einsum("dc,nchw->nd", weight, fmap) / fmap[0, 0].numel()
        embeddings = average / average.norm(dim=1, keepdim=True).clamp_min(1.0)
    assert embeddings.shape[0] == 3 * K
    expected = greedy_k_center(embeddings[K:], K, seeds=embeddings[:K])
    torch.testing.assert_close(model.head.prototypes.detach(), expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(before, expected)


def test_the_data_init_samples_show_a_bar_only_when_asked_or_on_a_terminal(capsys) -> None:
    from torch.utils.data import DataLoader, TensorDataset

    from aggzoo.training.callbacks import pooled_init_targets, sample_local_descriptors, sample_pooled_embeddings

    torch.manual_seed(0)
    model = VPRModel(TimmBackbone("test_resnet", out_indices=(3,)),
                     functools.partial(GSP, embedding_dim=16, num_prototypes=K))
    loader = DataLoader(TensorDataset(torch.rand(6, 3, 32, 48), torch.zeros(6)), batch_size=2)
    sample = functools.partial(sample_local_descriptors, model, loader, per_image=5, seed=0, device=torch.device("cpu"))
    shown = sample(progress=True)
    err = capsys.readouterr().err
    # the bar with its total (how far it is drawn depends on tqdm's refresh interval, not on the code)
    assert "k-means init sample" in err and "/3 " in err
    torch.testing.assert_close(sample(), shown)  # the bar changes nothing
    assert capsys.readouterr().err == ""  # stderr is not a terminal under pytest
    sample_pooled_embeddings(model, loader, pooled_init_targets(model), device=torch.device("cpu"), progress=True)
    assert "pooled init sample" in capsys.readouterr().err
