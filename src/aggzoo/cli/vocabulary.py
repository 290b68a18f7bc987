"""``aggzoo vocabulary <model> <image folder> --clusters 32 --out <file>``: fit a model's vocabulary from images.

``<model>`` is anything :func:`aggzoo.create_model` accepts: a registered architecture or tag
(``anyloc_dinov2_vitg14``, built with its backbone's own pretrained weights), a saved folder
(``local-dir:<folder>``) or a checkpoint that records its model. The images under ``<image folder>``
(recursive, sorted by path) are read as AnyLoc reads them (:mod:`aggzoo.training.vocabulary`); the centres
are written to ``--out`` (safetensors), which loads with ``aggzoo.create_model(<file>)`` or
``aggzoo.create_model(<name>, pretrained_backbone=True, checkpoint_path=<file>)``.
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Sequence
from pathlib import Path

from torch import nn

from aggzoo.cli.reporting import reported_user_errors
from aggzoo.data.layout import IMAGE_EXTENSIONS, images_under
from aggzoo.hub.builder import build_model
from aggzoo.hub.factory import create_model, is_model
from aggzoo.training.vocabulary import VocabularyOptions, fit_vocabulary, save_vocabulary

__all__ = ["images_in", "main", "with_clusters"]

_LAYOUT = f"a folder holding image files ({', '.join(IMAGE_EXTENSIONS)}; sub-folders are searched too)"


def images_in(folder: str | Path) -> tuple[Path, ...]:
    """The images under ``folder``; a missing, non-folder or image-less path raises :class:`DatasetLayoutError`."""
    return images_under(folder, f"image folder {folder}", _LAYOUT)


def with_clusters(model: nn.Module, clusters: int | None) -> nn.Module:
    """``model`` (read from a file), or the same backbone under a fresh head of ``clusters`` centres when its
    head has another number (the file's head tensors cannot load into a vocabulary of another size)."""
    if clusters is None or getattr(model.head, "kmeans_clusters", None) == clusters:
        return model
    spec = copy.deepcopy(model.aggzoo_spec)
    spec["head"]["num_clusters"] = clusters
    rebuilt = build_model(spec, pretrained_backbone=False)
    rebuilt.backbone.load_state_dict(model.backbone.state_dict())
    return rebuilt


def main(argv: Sequence[str] | None = None, prog: str = "aggzoo vocabulary") -> int:
    """``aggzoo vocabulary <model> <folder> --out <file>``: fit and write the vocabulary; the exit status."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    parser.add_argument("model", help="registered name (anyloc_dinov2_vitg14), local-dir:<folder> or a checkpoint")
    parser.add_argument("folder", help="the images to fit the vocabulary on (searched recursively)")
    parser.add_argument("--out", required=True, help="the .safetensors file to write")
    parser.add_argument("--clusters", type=int, default=None,
                        help="vocabulary size (the head's num_clusters; default: the model's, AnyLoc 32)")
    parser.add_argument("--image-size", type=int, nargs=2, default=(320, 320), metavar=("H", "W"),
                        help="resize before the crop to multiples of the patch size (AnyLoc: 320 320)")
    parser.add_argument("--every", type=int, default=1, help="use every n-th image (default: all)")
    parser.add_argument("--niter", type=int, default=100, help="k-means iterations (default 100)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--workers", type=int, default=0, help="image-reading processes (default 0: this one)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    args = parser.parse_args(argv)
    with reported_user_errors():
        images = images_in(args.folder)
        if is_model(args.model):  # a registered name: its backbone's own pretrained weights
            overrides = {} if args.clusters is None else {"num_clusters": args.clusters}
            model = create_model(args.model, pretrained_backbone=True, **overrides)
        else:
            model = with_clusters(create_model(args.model), args.clusters)
        options = VocabularyOptions(image_size=tuple(args.image_size), every=args.every, niter=args.niter,
                                    seed=args.seed, batch_size=args.batch_size, num_workers=args.workers,
                                    device=args.device)
        start = time.perf_counter()
        fit = fit_vocabulary(model, images, options)
        path = save_vocabulary(model.cpu(), args.out)
        print(f"{path}: vocabulary of {', '.join(fit.modules)} from {fit.descriptors.shape[0]} local features "
              f"({fit.descriptors.shape[1]}-D) of {fit.images} images in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
