"""Validation during training on a class-labelled set searched against itself (the metric-learning protocol,
``RetrievalSet.queries_are_database``): each image is read once and ranked against the others, its own image
left out, exactly as a brute-force ranking of the same descriptors gives (real Lightning Trainer, real JPEGs)."""

from __future__ import annotations

import functools
from pathlib import Path

import lightning.pytorch as L
import numpy as np
import torch
from class_labelled_files import write_class_folder
from pytorch_metric_learning.losses import ContrastiveLoss

from aggzoo.data.class_batches import ClassImagesDataset
from aggzoo.data.class_folder import read_class_folder
from aggzoo.data.class_retrieval import class_retrieval_set
from aggzoo.data.transforms import eval_transform
from aggzoo.evaluation.extraction import extract_descriptors
from aggzoo.evaluation.options import ExtractionOptions
from aggzoo.models.backbones.timm_backbone import TimmBackbone
from aggzoo.models.heads.gem import GeM
from aggzoo.models.vpr_model import VPRModel
from aggzoo.training.datamodule import VPRDataModule
from aggzoo.training.losses import MetricLoss
from aggzoo.training.module import VPRLightningModule


def test_validation_ranks_each_image_against_the_others(tmp_path: Path) -> None:
    images = read_class_folder(write_class_folder(tmp_path / "classes", {"a": 3, "b": 3, "c": 2, "d": 2}))
    benchmark = class_retrieval_set(images, name="classes")
    torch.manual_seed(0)
    model = VPRModel(TimmBackbone("test_resnet", out_indices=(3,)), functools.partial(GeM)).eval()
    transform = eval_transform((32, 48))
    module = VPRLightningModule(model, loss=MetricLoss(ContrastiveLoss()),
                                optimizer=functools.partial(torch.optim.SGD, lr=0.0), recall_ks=(1, 2, 4),
                                val_sets={"classes": (benchmark.num_database, benchmark.positives, True)})
    data = VPRDataModule(train_dataset=ClassImagesDataset(images, img_per_class=2, transform=transform),
                         val_sets={"classes": benchmark}, eval_transform=transform, places_per_batch=2, num_workers=0)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    logged = trainer.validate(module, datamodule=data, verbose=False)[0]

    # The same descriptors, ranked by brute force: every image against the 9 others.
    descriptors = extract_descriptors(model, list(images.paths), transform, ExtractionOptions(batch_size=4))
    similarity = descriptors @ descriptors.T
    np.fill_diagonal(similarity, -np.inf)
    expected = np.argsort(-similarity, axis=1, kind="stable")[:, :4]
    assert module.val_predictions["classes"].shape == (10, 4)
    np.testing.assert_array_equal(module.val_predictions["classes"], expected)
    for k in (1, 2, 4):
        hits = [bool(set(expected[q, :k]) & set(benchmark.positives[q].tolist())) for q in range(10)]
        assert abs(logged[f"val/classes/R@{k}"] - np.mean(hits)) < 1e-6  # logged as a fraction
