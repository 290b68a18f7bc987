"""Your own class-labelled images: one sub-folder per class, torchvision ``ImageFolder``'s convention::

    <root>/<class name>/**/<image>.jpg     (any depth below the class folder; .jpg .jpeg .png .bmp .tif .tiff .webp)

Classes are the sub-folders of ``<root>`` sorted by name and numbered ``0 .. C-1`` in that order; a class's
images are listed as ``ImageFolder`` lists them (``os.walk`` of the class folder, following links, folders in
sorted order, the files of each folder sorted by name). Files with other extensions are ignored; ImageFolder
also reads ``.ppm``/``.pgm``, which :func:`aggzoo.data.images.read_rgb` does not.
"""

from __future__ import annotations

import os
from pathlib import Path

from aggzoo.data.class_labelled import ClassLabelledImages
from aggzoo.data.class_retrieval import class_retrieval_set
from aggzoo.data.layout import IMAGE_EXTENSIONS, require_dir
from aggzoo.data.retrieval_set import RetrievalSet
from aggzoo.errors import DatasetLayoutError

__all__ = ["CLASS_FOLDER_LAYOUT", "class_names", "load_class_folder", "read_class_folder"]

CLASS_FOLDER_LAYOUT = "<root>/<class name>/<image>.jpg: one sub-folder per class (torchvision ImageFolder's layout)"
_SOURCE = "your own images (see aggzoo.data.class_folder)"


def class_names(root: str | Path) -> tuple[str, ...]:
    """The class names of a class folder, in label order (label ``c`` is ``class_names(root)[c]``)."""
    root = require_dir(Path(root), "class folder", CLASS_FOLDER_LAYOUT, _SOURCE)
    return tuple(sorted(entry.name for entry in os.scandir(root) if entry.is_dir()))


def _class_images(folder: Path) -> list[Path]:
    found = []
    for directory, _, files in sorted(os.walk(folder, followlinks=True)):
        found += [Path(directory) / f for f in sorted(files) if f.lower().endswith(IMAGE_EXTENSIONS)]
    return found


def read_class_folder(root: str | Path, *, name: str | None = None) -> ClassLabelledImages:
    """The images under ``root``, labelled by their class sub-folder (sorted names -> ``0 .. C-1``).

    Raises:
        DatasetLayoutError: ``root`` is missing, has no sub-folder, or a class folder holds no image.
    """
    root = Path(root)
    names = class_names(root)
    if not names:
        raise DatasetLayoutError(f"{root} has no class sub-folder. Expected layout: {CLASS_FOLDER_LAYOUT}. "
                                 f"Data: {_SOURCE}.")
    paths: list[Path] = []
    labels: list[int] = []
    empty = []
    for label, class_name in enumerate(names):
        images = _class_images(root / class_name)
        if not images:
            empty.append(class_name)
        paths += images
        labels += [label] * len(images)
    if empty:
        raise DatasetLayoutError(
            f"{len(empty)} class folders of {root} hold no image ({', '.join(empty[:5])}). Expected layout: "
            f"{CLASS_FOLDER_LAYOUT}, images with extensions {', '.join(IMAGE_EXTENSIONS)}. Data: {_SOURCE}.")
    return ClassLabelledImages(name or root.name, tuple(paths), labels)  # type: ignore[arg-type]


def load_class_folder(root: str | Path, *, name: str | None = None) -> RetrievalSet:
    """A class folder as a metric-learning benchmark: every image a query against all the others
    (:func:`aggzoo.data.class_retrieval.class_retrieval_set`), scored by Recall@k, MAP@R and R-Precision."""
    return class_retrieval_set(read_class_folder(root, name=name))
