"""Lightning callbacks: data-driven head initialisation and the untrained-baseline measurement."""

from __future__ import annotations

import logging
import time

import lightning.pytorch as L
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aggzoo.data.progress import progress_bar
from aggzoo.errors import ImageReadError
from aggzoo.models.backbones.timm_backbone import TimmBackbone
from aggzoo.models.data_init import DataInit, DataInitDeclaring
from aggzoo.models.modes import evaluating

__all__ = ["HeadDataInit", "UntrainedBaseline", "sample_local_descriptors", "sample_pooled_embeddings", "kmeans",
           "data_init_targets", "pooled_init_targets"]

log = logging.getLogger(__name__)


def _declaring(model: nn.Module, kind: DataInit) -> list[DataInitDeclaring]:
    return [m for m in model.modules() if isinstance(m, DataInitDeclaring) and m.data_init == kind]


def data_init_targets(model: nn.Module) -> list[DataInitDeclaring]:
    """Modules (heads or backbones) that declare ``data_init = "kmeans"`` (NetVLAD, ImAge tokens)."""
    return _declaring(model, "kmeans")


def pooled_init_targets(model: nn.Module) -> list[DataInitDeclaring]:
    """Modules that declare ``data_init = "pooled"`` (GSP's prototypes)."""
    return _declaring(model, "pooled")


def _local_feature_map(backbone: nn.Module, images: Tensor) -> Tensor:
    # A TimmBackbone says which map k-means reads (ImAge clusters the patch tokens of the plain
    # backbone, without its inserted tokens); any other backbone gives its last map.
    if isinstance(backbone, TimmBackbone):
        return backbone.data_init_features(images)
    return backbone(images).last


@torch.no_grad()
def sample_pooled_embeddings(model: nn.Module, loader: torch.utils.data.DataLoader,
                             targets: list[DataInitDeclaring], *,
                             device: torch.device, progress: bool | None = None) -> list[Tensor]:
    """For each target, its ``pooled_embedding(backbone features)`` of every image: ``[N, D]`` each.
    ``progress``: a tqdm bar over the batches (``None``: only on a terminal)."""
    chunks: list[list[Tensor]] = [[] for _ in targets]
    with evaluating(model), progress_bar(loader, progress, "pooled init sample", unit="batch") as batches:
        for batch in batches:
            if batch is None:  # every image of the batch was unreadable and skipped (bad_images=skip)
                continue
            images, _ = batch
            features = model.backbone(images.to(device))
            for chunk, target in zip(chunks, targets, strict=True):
                chunk.append(target.pooled_embedding(features).float().cpu())
    if not chunks[0] and targets:
        raise ImageReadError(f"none of the {len(loader.dataset)} training images sampled for the head's data-driven "
                             "initialisation could be read (bad_images=skip skipped them all); fix the training data")
    return [torch.cat(chunk) for chunk in chunks]


@torch.no_grad()
def sample_local_descriptors(model: nn.Module, loader: torch.utils.data.DataLoader, *,
                             per_image: int, seed: int, device: torch.device,
                             progress: bool | None = None) -> Tensor:
    """L2-normalised local features ``[N, C]`` of the backbone's last map, ``per_image`` random
    positions per image (all positions when the map is smaller). ``progress``: a tqdm bar over the
    batches (``None``: only on a terminal)."""
    gen = torch.Generator().manual_seed(seed)
    chunks = []
    with evaluating(model), progress_bar(loader, progress, "k-means init sample", unit="batch") as batches:
        for batch in batches:
            if batch is None:  # every image of the batch was unreadable and skipped (bad_images=skip)
                continue
            images = batch[0].to(device)
            fmap = _local_feature_map(model.backbone, images).float()  # [B, C, H, W]
            local = F.normalize(fmap.flatten(2).transpose(1, 2), dim=2).cpu()  # [B, HW, C]
            for feats in local:
                take = torch.randperm(feats.shape[0], generator=gen)[: per_image]
                chunks.append(feats[take])
    if not chunks:
        raise ImageReadError(f"none of the {len(loader.dataset)} training images sampled for the head's data-driven "
                             "initialisation could be read (bad_images=skip skipped them all); fix the training data")
    return torch.cat(chunks)


def kmeans(descriptors: Tensor, num_clusters: int, *, niter: int = 100, seed: int = 0, spherical: bool = False,
           every_point: bool = False) -> Tensor:
    """faiss k-means (as the NetVLAD reference code): ``[N, C] -> centroids [K, C]``.

    ``spherical``: cosine k-means (unit-norm centres after every update; AnyLoc's vocabularies);
    ``every_point``: cluster all ``N`` points (faiss otherwise samples 256 per centre).
    """
    import faiss

    if descriptors.shape[0] < num_clusters:
        raise ValueError(f"k-means needs at least {num_clusters} local descriptors, got {descriptors.shape[0]}: "
                         "sample more images for the initialisation (callbacks.head_data_init.num_images)")
    data = np.ascontiguousarray(descriptors.numpy().astype(np.float32))
    limit = {"max_points_per_centroid": -(-data.shape[0] // num_clusters)} if every_point else {}
    km = faiss.Kmeans(data.shape[1], num_clusters, niter=niter, seed=seed, verbose=False, spherical=spherical, **limit)
    km.train(data)
    return torch.from_numpy(km.centroids.copy())


class HeadDataInit(L.Callback):
    """Initialise heads from data before the first step. Two protocols:

    - ``data_init = "kmeans"`` (NetVLAD centroids, ImAge tokens): ``descriptors_per_image`` local
      features from each of ``num_images`` training images (the reference NetVLAD code uses ~50k
      descriptors, ~100 per image), clustered with faiss k-means into ``kmeans_clusters`` centres;
      then ``init_from_clusters(centroids, descriptors)`` (:func:`data_init_targets`);
    - ``data_init = "pooled"`` (GSP prototypes): ``pooled_embedding(features)`` of ``pooled_images``
      training images (upstream GSP keeps a 1024-entry memory), passed to ``init_from_pooled``
      (:func:`pooled_init_targets`).

    Modules are chosen by the kind they declare (:mod:`aggzoo.models.data_init`), and only the
    methods of that kind are called.

    Skipped when the run resumes from a checkpoint, whose weights are already trained.
    """

    def __init__(self, *, num_images: int = 500, descriptors_per_image: int = 100, niter: int = 100,
                 pooled_images: int = 1024, seed: int = 0) -> None:
        self.num_images = num_images
        self.descriptors_per_image = descriptors_per_image
        self.niter = niter
        self.pooled_images = pooled_images
        self.seed = seed

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.ckpt_path is not None:
            return
        model, device = pl_module.model, pl_module.device
        if targets := data_init_targets(model):
            start = time.perf_counter()
            loader = trainer.datamodule.feature_sample_dataloader(self.num_images, seed=self.seed)
            descriptors = sample_local_descriptors(model, loader, per_image=self.descriptors_per_image,
                                                   seed=self.seed, device=device)
            for target in targets:
                centroids = kmeans(descriptors, target.kmeans_clusters, niter=self.niter, seed=self.seed)
                target.init_from_clusters(centroids.to(device), descriptors.to(device))
            log.info("k-means init of %s from %d local descriptors in %.1fs",
                     [type(t).__name__ for t in targets], descriptors.shape[0], time.perf_counter() - start)
        if targets := pooled_init_targets(model):
            start = time.perf_counter()
            loader = trainer.datamodule.feature_sample_dataloader(self.pooled_images, seed=self.seed)
            for target, embeddings in zip(targets, sample_pooled_embeddings(model, loader, targets, device=device),
                                          strict=True):
                target.init_from_pooled(embeddings.to(device))
            log.info("init of %s from the pooled embeddings of %d images in %.1fs",
                     [type(t).__name__ for t in targets], len(loader.dataset), time.perf_counter() - start)


class UntrainedBaseline(L.Callback):
    """Measures the model as it is before its first optimisation step (after any data-driven
    initialisation) on the test sets: the "untrained baseline" of the same backbone and head.

    With ``with_global_pooling`` it also measures the classical baseline of the same (still
    untrained) backbone: global average pooling of its last map, no learned aggregation.
    Skipped when resuming from a checkpoint. Results land in :attr:`results` and
    :attr:`pooling_results`.
    """

    def __init__(self, sets: dict, transform: object, *, recall_ks: tuple[int, ...], batch_size: int,
                 num_workers: int, with_global_pooling: bool = True) -> None:
        self.sets = sets
        self.transform = transform
        self.recall_ks = recall_ks
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.with_global_pooling = with_global_pooling
        self.results: list = []
        self.pooling_results: list = []

    def _evaluate(self, model: nn.Module, device: torch.device) -> list:
        from aggzoo.evaluation.loop import evaluate_retrieval
        from aggzoo.evaluation.options import EvaluationOptions, ExtractionOptions

        options = EvaluationOptions(ks=tuple(self.recall_ks), extraction=ExtractionOptions(
            batch_size=self.batch_size, num_workers=self.num_workers, device=str(device)))
        return [evaluate_retrieval(model, s, self.transform, options) for s in self.sets.values()]

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        from aggzoo.models.heads.avgpool import AvgPool
        from aggzoo.models.vpr_model import VPRModel

        if trainer.ckpt_path is not None or not trainer.is_global_zero:
            return
        self.results = self._evaluate(pl_module.model, pl_module.device)
        if self.with_global_pooling:
            backbone = pl_module.model.backbone
            self.pooling_results = self._evaluate(VPRModel(backbone, AvgPool(backbone.out_channels)), pl_module.device)
