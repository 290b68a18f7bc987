"""The deep-metric-learning benchmarks in their published layouts: CUB-200-2011, Cars196, Stanford Online
Products and In-shop Clothes Retrieval.

Each reader takes the dataset's own folder (or the folder that holds it under its archive's name, as
pytorch-metric-learning's dataset classes do) and a split, and returns a :class:`ClassLabelledImages` labelled by
the dataset's own class ids. The splits are the ones every metric-learning paper uses (Oh Song et al., "Deep
Metric Learning via Lifted Structured Feature Embedding", CVPR 2016; Musgrave et al., "A Metric Learning
Reality Check", ECCV 2020), and the zero-shot protocol: training and test classes are disjoint.

CUB-200-2011 (``CUB_200_2011.tgz``; 11,788 images, 200 classes)::

    <root>/CUB_200_2011/images.txt               <image id> <path relative to images/>
    <root>/CUB_200_2011/image_class_labels.txt   <image id> <class id 1..200>
    <root>/CUB_200_2011/images/<path>
    train: classes 1-100 (5,864 images); test: classes 101-200 (5,924 images)

Cars196 (Stanford Cars, all images with one annotation file, as the metric-learning code reads it, e.g.
Proxy-Anchor's ``dataset/cars.py``)::

    <root>/cars_annos.mat        struct array ``annotations`` with fields relative_im_path ("car_ims/000001.jpg")
                                 and class (1..196); bbox_* and test are not used
    <root>/car_ims/<name>.jpg
    train: classes 1-98 (8,054 images); test: classes 99-196 (8,131 images)

or the copy pytorch-metric-learning's ``Cars196`` downloads (the same images and classes, split into the
devkit's train and test folders)::

    <root>/names.csv                               one class name per line (class c on line c)
    <root>/anno_train.csv, anno_test.csv           <file>,x1,y1,x2,y2,<class>  (no header)
    <root>/car_data/car_data/{train,test}/<class name, "/" replaced by "-">/<file>

Stanford Online Products (``Stanford_Online_Products.zip``; 120,053 images, 22,634 products)::

    <root>/Stanford_Online_Products/Ebay_train.txt, Ebay_test.txt
                                 header "image_id class_id super_class_id path", then one image per line,
                                 path relative to Stanford_Online_Products/
    train: 11,318 classes (59,551 images); test: 11,316 classes (60,502 images)

In-shop Clothes Retrieval (DeepFashion; ``Img/img.zip`` and ``Eval/list_eval_partition.txt``)::

    <root>/Eval/list_eval_partition.txt    line 1: the number of images; line 2: "image_name item_id
                                           evaluation_status"; then "img/<...>.jpg id_<digits> train|query|gallery"
    <root>/Img/img/<...>.jpg               (the archive's img/ under Img/; img/ directly under <root> also works)
    train: 3,997 items (25,882 images); query: 14,218 images and gallery: 12,612 images of 3,985 items

The ``.mat`` file is read by ``scipy.io.loadmat``, which parses MATLAB's data format only: nothing in the
file chooses code to run.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
from scipy.io import loadmat
from scipy.io.matlab import MatReadError

from aggzoo.data.class_labelled import ClassLabelledImages
from aggzoo.data.class_retrieval import class_retrieval_set
from aggzoo.data.layout import require_dir, require_file, require_images
from aggzoo.data.retrieval_set import RetrievalSet
from aggzoo.errors import DatasetFormatError

__all__ = ["LAYOUTS", "SOURCES", "load_metric_learning", "read_cars196", "read_cub200", "read_inshop", "read_sop"]

LAYOUTS = {
    "cub200": "<root>/CUB_200_2011/images.txt, image_class_labels.txt and images/<path> (the CUB_200_2011.tgz archive)",
    "cars196": "<root>/cars_annos.mat (struct array 'annotations': relative_im_path, class) and <root>/car_ims/*.jpg; "
               "or pytorch-metric-learning's copy: <root>/names.csv, anno_train.csv, anno_test.csv and "
               "<root>/car_data/car_data/{train,test}/<class name>/<file>",
    "sop": "<root>/Stanford_Online_Products/Ebay_train.txt and Ebay_test.txt (image_id class_id super_class_id "
           "path) and the images at Stanford_Online_Products/<path>",
    "inshop": "<root>/Eval/list_eval_partition.txt (image_name item_id evaluation_status) and "
              "<root>/Img/img/... (the Img/img.zip archive)",
}
SOURCES = {
    "cub200": "https://www.vision.caltech.edu/datasets/cub_200_2011/ "
              "(https://data.caltech.edu/records/65de6-vp158/files/CUB_200_2011.tgz)",
    "cars196": "http://ai.stanford.edu/~jkrause/cars/car_dataset.html (car_ims.tgz and cars_annos.mat), or "
               "https://www.kaggle.com/datasets/jutrera/stanford-car-dataset-by-classes-folder (pytorch-metric-learning's "
               "Cars196 download)",
    "sop": "https://cvgl.stanford.edu/projects/lifted_struct/ (Stanford_Online_Products.zip)",
    "inshop": "https://mmlab.ie.cuhk.edu.hk/projects/DeepFashion/InShopRetrieval.html (Img/img.zip, "
              "Eval/list_eval_partition.txt)",
}
#: the classes of each split (CUB-200-2011 and Cars196: the first half of the classes trains, the second tests)
_CLASS_SPLITS = {"cub200": {"train": (1, 100), "test": (101, 200)},
                 "cars196": {"train": (1, 98), "test": (99, 196)}}
_INSHOP_ITEM = re.compile(r"id_(\d+)")


def _folder(root: str | Path, archive_dir: str, dataset: str) -> Path:
    """``<root>/<archive_dir>`` when it exists, else ``<root>`` (the dataset's own folder)."""
    root = require_dir(Path(root), f"{dataset} folder", LAYOUTS[dataset], SOURCES[dataset])
    return root / archive_dir if (root / archive_dir).is_dir() else root


def _check_split(split: str, splits: Iterable[str], dataset: str) -> None:
    if split not in splits:
        raise DatasetFormatError(f"{dataset} has the splits {sorted(splits)}, not {split!r}")


def _relative(name: str, origin: str, dataset: str) -> str:
    """``name`` if it is a relative path that stays inside its folder."""
    parts = PurePosixPath(name.replace("\\", "/")).parts
    if not parts or name.startswith(("/", "\\")) or ".." in parts:
        raise DatasetFormatError(f"{origin}: {name!r} is not a path inside the dataset folder. "
                                 f"Expected layout: {LAYOUTS[dataset]}.")
    return name


def _table(path: Path, columns: int, dataset: str, skip: int = 0) -> list[tuple[int, list[str]]]:
    """``(line number, fields)`` of the whitespace-separated lines after ``skip`` header lines."""
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if number <= skip or not line.strip():
            continue
        fields = line.split()
        if len(fields) != columns:
            raise DatasetFormatError(f"{path}, line {number}: expected {columns} fields, got {line.strip()[:200]!r}. "
                                     f"Expected layout: {LAYOUTS[dataset]}.")
        rows.append((number, fields))
    return rows


def _int(value: str, path: Path, number: int, dataset: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise DatasetFormatError(f"{path}, line {number}: {value!r} is not an integer. "
                                 f"Expected layout: {LAYOUTS[dataset]}.") from None


def _keep_classes(paths: list[Path], labels: list[int], classes: tuple[int, int], name: str, dataset: str,
                  origin: Path) -> ClassLabelledImages:
    labels_array = np.asarray(labels, dtype=np.int64)
    keep = (labels_array >= classes[0]) & (labels_array <= classes[1])
    if not keep.any():
        raise DatasetFormatError(f"{origin}: no image of classes {classes[0]}-{classes[1]}. "
                                 f"Expected layout: {LAYOUTS[dataset]}.")
    images = ClassLabelledImages(name, tuple(paths), labels_array).subset(keep)
    require_images(images.paths, f"images of {name} listed in {origin.name}", LAYOUTS[dataset], SOURCES[dataset])
    return images


def read_cub200(root: str | Path, split: str = "test") -> ClassLabelledImages:
    """CUB-200-2011's ``split`` (``"train"``: classes 1-100, ``"test"``: 101-200), in ``images.txt`` order."""
    _check_split(split, _CLASS_SPLITS["cub200"], "cub200")
    folder = _folder(root, "CUB_200_2011", "cub200")
    listing = require_file(folder / "images.txt", "CUB-200-2011 image list", LAYOUTS["cub200"], SOURCES["cub200"])
    labelling = require_file(folder / "image_class_labels.txt", "CUB-200-2011 labels", LAYOUTS["cub200"],
                             SOURCES["cub200"])
    label_of = {}
    for number, (image_id, class_id) in _table(labelling, 2, "cub200"):
        label_of[image_id] = _int(class_id, labelling, number, "cub200")
    paths, labels = [], []
    for number, (image_id, name) in _table(listing, 2, "cub200"):
        if image_id not in label_of:
            raise DatasetFormatError(f"{listing}, line {number}: image {image_id} has no class in {labelling.name}. "
                                     f"Expected layout: {LAYOUTS['cub200']}.")
        paths.append(folder / "images" / _relative(name, f"{listing}, line {number}", "cub200"))
        labels.append(label_of[image_id])
    return _keep_classes(paths, labels, _CLASS_SPLITS["cub200"][split], f"cub200_{split}", "cub200", listing)


def _mat_annotations(path: Path) -> list[Mapping[str, Any]]:
    try:
        content = loadmat(path, simplify_cells=True)
    except (MatReadError, ValueError, TypeError, NotImplementedError, OSError, EOFError, KeyError, IndexError) as err:
        raise DatasetFormatError(f"{path}: cannot read as a MATLAB .mat file ({type(err).__name__}: {err}). "
                                 f"Expected layout: {LAYOUTS['cars196']}.") from None
    annotations = content.get("annotations")
    if isinstance(annotations, dict):  # a struct array of one element comes back as one dict
        annotations = [annotations]
    if (not isinstance(annotations, (list, np.ndarray)) or not len(annotations)
            or not all(isinstance(a, dict) and {"relative_im_path", "class"} <= set(a) for a in annotations)):
        raise DatasetFormatError(f"{path}: expected a struct array 'annotations' with fields relative_im_path and "
                                 f"class, found the variables {sorted(k for k in content if not k.startswith('__'))}. "
                                 f"Expected layout: {LAYOUTS['cars196']}.")
    return list(annotations)


def _cars_from_csvs(folder: Path) -> tuple[list[Path], list[int], Path]:
    """pytorch-metric-learning's Cars196 copy: ``anno_train.csv`` then ``anno_test.csv`` (``<file>,x1,y1,x2,y2,<class>``,
    no header), each image under ``car_data/car_data/<train|test>/<class name, '/' -> '-'>/`` (``names.csv``: one
    class name per line, class ``c`` on line ``c``)."""
    names_file = require_file(folder / "names.csv", "Cars196 class names", LAYOUTS["cars196"], SOURCES["cars196"])
    names = [line.strip() for line in names_file.read_text(encoding="utf-8").splitlines()]
    paths, labels = [], []
    for part in ("train", "test"):
        listing = require_file(folder / f"anno_{part}.csv", f"Cars196 {part} annotations", LAYOUTS["cars196"],
                               SOURCES["cars196"])
        for number, line in enumerate(listing.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            fields = line.split(",")
            label = _int(fields[-1].strip(), listing, number, "cars196")
            if len(fields) != 6 or not 1 <= label <= len(names):
                raise DatasetFormatError(f"{listing}, line {number}: expected <file>,x1,y1,x2,y2,<class 1..{len(names)}>, "
                                         f"got {line[:200]!r}. Expected layout: {LAYOUTS['cars196']}.")
            name = _relative(fields[0].strip(), f"{listing}, line {number}", "cars196")
            class_dir = _relative(names[label - 1].replace("/", "-"), f"{names_file}, line {label}", "cars196")
            paths.append(folder / "car_data" / "car_data" / part / class_dir / name)
            labels.append(label)
    return paths, labels, folder / "anno_train.csv"


def read_cars196(root: str | Path, split: str = "test") -> ClassLabelledImages:
    """Cars196's ``split`` (``"train"``: classes 1-98, ``"test"``: 99-196), in ``cars_annos.mat`` order (or, in
    pytorch-metric-learning's copy without the ``.mat``, ``anno_train.csv`` then ``anno_test.csv`` order)."""
    _check_split(split, _CLASS_SPLITS["cars196"], "cars196")
    folder = _folder(root, "cars196", "cars196")
    mat = folder / "cars_annos.mat"
    if not mat.is_file() and (folder / "names.csv").is_file():
        paths, labels, origin = _cars_from_csvs(folder)
        return _keep_classes(paths, labels, _CLASS_SPLITS["cars196"][split], f"cars196_{split}", "cars196", origin)
    require_file(mat, "Cars196 annotations", LAYOUTS["cars196"], SOURCES["cars196"])
    paths, labels = [], []
    for index, entry in enumerate(_mat_annotations(mat)):
        name, label = entry["relative_im_path"], entry["class"]
        if not isinstance(name, str) or not np.issubdtype(np.asarray(label).dtype, np.number) or np.ndim(label):
            raise DatasetFormatError(f"{mat}: annotation {index} has relative_im_path {name!r} and class {label!r}; "
                                     f"expected a path and a class number. Expected layout: {LAYOUTS['cars196']}.")
        paths.append(folder / _relative(name, f"{mat}, annotation {index}", "cars196"))
        labels.append(int(label))
    return _keep_classes(paths, labels, _CLASS_SPLITS["cars196"][split], f"cars196_{split}", "cars196", mat)


def read_sop(root: str | Path, split: str = "test") -> ClassLabelledImages:
    """Stanford Online Products' ``split`` (``"train"``: ``Ebay_train.txt``, ``"test"``: ``Ebay_test.txt``), in the
    file's order, labelled by ``class_id``."""
    _check_split(split, ("train", "test"), "sop")
    folder = _folder(root, "Stanford_Online_Products", "sop")
    listing = require_file(folder / f"Ebay_{split}.txt", f"Stanford Online Products {split} list", LAYOUTS["sop"],
                           SOURCES["sop"])
    header = listing.read_text(encoding="utf-8").split("\n", 1)[0].split()
    if header != ["image_id", "class_id", "super_class_id", "path"]:
        raise DatasetFormatError(f"{listing}: the header is {header}, expected image_id class_id super_class_id path. "
                                 f"Expected layout: {LAYOUTS['sop']}.")
    paths, labels = [], []
    for number, (_, class_id, _, name) in _table(listing, 4, "sop", skip=1):
        labels.append(_int(class_id, listing, number, "sop"))
        paths.append(folder / _relative(name, f"{listing}, line {number}", "sop"))
    if not paths:
        raise DatasetFormatError(f"{listing}: lists no image. Expected layout: {LAYOUTS['sop']}.")
    images = ClassLabelledImages(f"sop_{split}", tuple(paths), np.asarray(labels, dtype=np.int64))
    require_images(images.paths, f"images listed in {listing.name}", LAYOUTS["sop"], SOURCES["sop"])
    return images


def read_inshop(root: str | Path, split: str = "query") -> ClassLabelledImages:
    """In-shop's ``split`` (``"train"``, ``"query"`` or ``"gallery"``), in ``list_eval_partition.txt`` order,
    labelled by the number of the item id (``id_00000002`` -> 2)."""
    _check_split(split, ("train", "query", "gallery"), "inshop")
    folder = _folder(root, "Inshop_Clothes", "inshop")
    listing = folder / "Eval" / "list_eval_partition.txt"
    if not listing.is_file() and (folder / "list_eval_partition.txt").is_file():
        listing = folder / "list_eval_partition.txt"
    require_file(listing, "In-shop partition list", LAYOUTS["inshop"], SOURCES["inshop"])
    image_dir = folder / "Img" if (folder / "Img").is_dir() else folder
    lines = listing.read_text(encoding="utf-8").splitlines()
    if len(lines) < 2 or not lines[0].strip().isdigit() or lines[1].split() != ["image_name", "item_id",
                                                                               "evaluation_status"]:
        raise DatasetFormatError(f"{listing}: expected the number of images on line 1 and 'image_name item_id "
                                 f"evaluation_status' on line 2. Expected layout: {LAYOUTS['inshop']}.")
    rows = _table(listing, 3, "inshop", skip=2)
    if len(rows) != int(lines[0]):
        raise DatasetFormatError(f"{listing}: line 1 announces {int(lines[0])} images, the file lists {len(rows)} "
                                 f"(truncated?). Expected layout: {LAYOUTS['inshop']}.")
    paths, labels = [], []
    for number, (name, item, status) in rows:
        match = _INSHOP_ITEM.fullmatch(item)
        if match is None or status not in ("train", "query", "gallery"):
            raise DatasetFormatError(f"{listing}, line {number}: expected id_<digits> and train|query|gallery, got "
                                     f"{item!r} {status!r}. Expected layout: {LAYOUTS['inshop']}.")
        if status == split:
            paths.append(image_dir / _relative(name, f"{listing}, line {number}", "inshop"))
            labels.append(int(match.group(1)))
    if not paths:
        raise DatasetFormatError(f"{listing}: lists no {split} image. Expected layout: {LAYOUTS['inshop']}.")
    images = ClassLabelledImages(f"inshop_{split}", tuple(paths), np.asarray(labels, dtype=np.int64))
    require_images(images.paths, f"{split} images listed in {listing.name}", LAYOUTS["inshop"], SOURCES["inshop"])
    return images


_READERS: dict[str, Callable[[str | Path, str], ClassLabelledImages]] = {
    "cub200": read_cub200, "cars196": read_cars196, "sop": read_sop}


def load_metric_learning(root: str | Path, *, dataset: str, split: str = "test", name: str | None = None) -> RetrievalSet:
    """A metric-learning benchmark as a :class:`RetrievalSet` (Recall@k, MAP@R, R-Precision): CUB-200-2011,
    Cars196 and SOP search every image of ``split`` against the others; In-shop's ``"test"`` searches its query
    images in its gallery (its ``"train"`` split is searched like the others).

    Args:
        root: the dataset folder (see the module docstring for each layout).
        dataset: ``"cub200"``, ``"cars196"``, ``"sop"`` or ``"inshop"``.
        split: ``"test"`` (the benchmark) or ``"train"``.
        name: the benchmark's name in reports (default ``<dataset>_<split>``).
    """
    if dataset == "inshop":
        _check_split(split, ("train", "test"), "inshop")
        if split == "test":
            return class_retrieval_set(read_inshop(root, "gallery"), read_inshop(root, "query"),
                                       name=name or "inshop_test")
        return class_retrieval_set(read_inshop(root, "train"), name=name)
    if dataset not in _READERS:
        raise DatasetFormatError(f"unknown metric-learning dataset {dataset!r}; known: {sorted(LAYOUTS)}")
    return class_retrieval_set(_READERS[dataset](root, split), name=name)
