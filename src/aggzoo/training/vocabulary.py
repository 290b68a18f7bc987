"""Fitting a model's vocabulary from a folder of images (``aggzoo vocabulary``): AnyLoc's domain vocabularies.

AnyLoc (AnyLoc/AnyLoc ``scripts/dino_v2_global_vocab_vlad.py``) fits its VLAD centres as follows, and so does
:func:`fit_vocabulary`: every chosen image is resized to 320 x 320 (ImageNet mean/std) and centre-cropped to
multiples of the patch size (308 x 308); *all* its local features are kept (no per-image sampling; the
authors thin a data set only by taking every n-th database image); the features are L2-normalised and
clustered by cosine k-means (``fast_pytorch_kmeans`` in ``mode="cosine"``, at most 100 iterations; here
faiss's spherical k-means, 100 iterations, on every point). Each module of the model that declares a k-means
initialisation (:attr:`~aggzoo.models.data_init.DataInitDeclaring.data_init` ``"kmeans"``) then takes the
centres through its own ``init_from_clusters`` (AnyLoc's head keeps the members' means, as the authors' centres are).

The file written (:func:`save_vocabulary`) is a safetensors file with the model's spec in its metadata:
``aggzoo.create_model(<file>)`` rebuilds the model from it, and
``aggzoo.create_model(<name>, pretrained_backbone=True, checkpoint_path=<file>)`` loads it into a named one.
It holds the head's tensors and, when the backbone was not built from its own pretrained weights, the
backbone's too, so it always describes the whole model.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader

from aggzoo.data.retrieval_set import ImageListDataset
from aggzoo.data.transforms import CentreCropToMultiple, eval_transform
from aggzoo.data.workers import loader_workers
from aggzoo.errors import ConfigError
from aggzoo.hub.checkpoint import SPEC_KEY
from aggzoo.hub.saving import save_weights
from aggzoo.training.callbacks import data_init_targets, kmeans, sample_local_descriptors

__all__ = ["VocabularyFit", "VocabularyOptions", "fit_vocabulary", "save_vocabulary", "vocabulary_transform"]

#: more positions than any map has: every local feature of every image
_EVERY_POSITION = 1 << 62


@dataclass(frozen=True)
class VocabularyOptions:
    """How :func:`fit_vocabulary` reads the images and clusters their features (AnyLoc's values by default).

    Attributes:
        image_size: ``(H, W)`` every image is resized to before the crop to multiples of the patch size.
        every: use every n-th image of the sorted list (AnyLoc's per-data-set sub-sampling).
        niter: k-means iterations.
        seed: k-means seed.
        batch_size, num_workers, device, progress: how the features are extracted.
    """

    image_size: tuple[int, int] = (320, 320)
    every: int = 1
    niter: int = 100
    seed: int = 0
    batch_size: int = 8
    num_workers: int | None = None
    device: str = "cpu"
    progress: bool | None = None


@dataclass(frozen=True)
class VocabularyFit:
    """What :func:`fit_vocabulary` did: the images used, the local features clustered ``[N, C]``, and
    the modules it initialised (by their names in the model)."""

    images: int
    descriptors: Tensor
    modules: tuple[str, ...]


def vocabulary_transform(model: nn.Module, image_size: Sequence[int]) -> CentreCropToMultiple:
    """AnyLoc's preprocessing for the model's backbone: bilinear resize to ``image_size``, ImageNet mean/std,
    centre crop to multiples of the last map's stride (the patch size of a ViT)."""
    stride = int(model.backbone.feature_info[-1]["reduction"])
    return CentreCropToMultiple(eval_transform(tuple(image_size), interpolation="bilinear"), stride)


def fit_vocabulary(model: nn.Module, images: Sequence[Path], options: VocabularyOptions = VocabularyOptions()
                   ) -> VocabularyFit:
    """Cluster the local features of ``images`` (every ``options.every``-th) and initialise every module of
    ``model`` that declares ``data_init = "kmeans"`` from the centres (see the module docstring)."""
    declaring = {id(module) for module in data_init_targets(model)}
    targets = {name: module for name, module in model.named_modules() if id(module) in declaring}
    if not targets:
        raise ConfigError(f"{type(getattr(model, 'head', model)).__name__} has no vocabulary to fit: no module of "
                          "this model declares a k-means initialisation (AnyLoc, NetVLAD, SuperVLAD heads do)")
    chosen = list(images)[:: max(1, int(options.every))]
    dataset = ImageListDataset(chosen, vocabulary_transform(model, options.image_size))
    loader = DataLoader(dataset, batch_size=options.batch_size, shuffle=False,
                        num_workers=loader_workers(options.num_workers, len(chosen)))
    device = torch.device(options.device)
    model.to(device)
    descriptors = sample_local_descriptors(model, loader, per_image=_EVERY_POSITION, seed=options.seed,
                                          device=device, progress=options.progress)
    for module in targets.values():
        clusters = module.kmeans_clusters
        if descriptors.shape[0] < clusters:
            raise ConfigError(f"{len(chosen)} image(s) gave {descriptors.shape[0]} local features, fewer than the "
                              f"{clusters} centres to fit: give more images (or a smaller --clusters)")
        centres = kmeans(descriptors, clusters, niter=options.niter, seed=options.seed, spherical=True,
                         every_point=True)
        module.init_from_clusters(centres.to(device), descriptors.to(device))
    return VocabularyFit(images=len(chosen), descriptors=descriptors, modules=tuple(targets))


def save_vocabulary(model: nn.Module, path: str | Path) -> Path:
    """Write the fitted model to ``path`` (safetensors, the spec in its metadata): its head's tensors, plus
    the backbone's unless the spec builds the backbone from its own pretrained weights."""
    spec = getattr(model, "aggzoo_spec", None)
    if spec is None:
        raise ConfigError("the model records no spec (model.aggzoo_spec): build it with aggzoo.create_model")
    pretrained_backbone = bool(spec["backbone"].get("pretrained"))
    state = {key: value for key, value in model.state_dict().items()
             if not (pretrained_backbone and key.startswith("backbone."))}
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    return save_weights(state, path, {SPEC_KEY: json.dumps(spec, sort_keys=True)})
