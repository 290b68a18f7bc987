"""Class-labelled datasets written in their published layouts, with real JPEG files (small noise images):
GLDv2-clean, a class folder, CUB-200-2011, Cars196 (``cars_annos.mat`` written by scipy), Stanford Online
Products and In-shop. Each writer returns the dataset folder and what a reader must find in it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.io
from image_files import write_noise_images

SHAPE = (12, 16, 3)


def _jpeg(path: Path, seed: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_noise_images(path.parent, 1, SHAPE, seed=seed, name=path.name)
    return path


def write_gldv2(root: Path, landmarks: dict[int, list[str]]) -> Path:
    """``train_clean.csv`` (landmark_id,images) and ``train/a/b/c/<id>.jpg`` for every listed id."""
    root.mkdir(parents=True, exist_ok=True)
    lines = ["landmark_id,images"] + [f"{landmark},{' '.join(ids)}" for landmark, ids in landmarks.items()]
    (root / "train_clean.csv").write_text("\n".join(lines) + "\n")
    for seed, image_id in enumerate(i for ids in landmarks.values() for i in ids):
        _jpeg(root / "train" / image_id[0] / image_id[1] / image_id[2] / f"{image_id}.jpg", seed)
    return root


def write_class_folder(root: Path, counts: dict[str, int]) -> Path:
    """``<root>/<class>/<i>.jpg``, ``counts[class]`` images per class."""
    for seed, (name, count) in enumerate(counts.items()):
        (root / name).mkdir(parents=True, exist_ok=True)
        write_noise_images(root / name, count, SHAPE, seed=seed, name="{i}.jpg")
    return root


def write_cub(root: Path, per_class: int = 2, classes: int = 200) -> Path:
    """``CUB_200_2011/`` with ``per_class`` images of each class ``1..classes`` (ids in class order, as released)."""
    folder = root / "CUB_200_2011"
    images, labels = [], []
    for c in range(1, classes + 1):
        for j in range(per_class):
            image_id = len(images) + 1
            name = f"{c:03d}.Bird_{c}/Bird_{c}_{j}.jpg"
            _jpeg(folder / "images" / name, image_id)
            images.append(f"{image_id} {name}")
            labels.append(f"{image_id} {c}")
    (folder / "images.txt").write_text("\n".join(images) + "\n")
    (folder / "image_class_labels.txt").write_text("\n".join(labels) + "\n")
    return root


def write_cars(root: Path, per_class: int = 2, classes: int = 196) -> Path:
    """``cars_annos.mat`` (struct array ``annotations``: relative_im_path, bbox_*, class, test, as released) and
    ``car_ims/<n>.jpg``."""
    rows = []
    for c in range(1, classes + 1):
        for _ in range(per_class):
            name = f"car_ims/{len(rows) + 1:06d}.jpg"
            _jpeg(root / name, len(rows))
            rows.append((name, 1, 2, 30, 40, c, len(rows) % 2))
    dtype = [("relative_im_path", object), ("bbox_x1", object), ("bbox_y1", object), ("bbox_x2", object),
             ("bbox_y2", object), ("class", object), ("test", object)]
    annotations = np.array([rows], dtype=dtype)  # MATLAB's 1 x N struct array
    class_names = np.array([[f"Car {c}" for c in range(1, classes + 1)]], dtype=object)
    scipy.io.savemat(root / "cars_annos.mat", {"annotations": annotations, "class_names": class_names})
    return root


def write_sop(root: Path, train_classes: int = 4, test_classes: int = 3, per_class: int = 2) -> Path:
    """``Stanford_Online_Products/Ebay_{train,test}.txt`` and their images (class ids continue from train to test)."""
    folder = root / "Stanford_Online_Products"
    image_id = 0
    for split, classes, first in (("train", train_classes, 1), ("test", test_classes, train_classes + 1)):
        lines = ["image_id class_id super_class_id path"]
        for c in range(first, first + classes):
            for j in range(per_class):
                image_id += 1
                name = f"bicycle_final/{c}_{j}.JPG"
                _jpeg(folder / name, image_id)
                lines.append(f"{image_id} {c} 1 {name}")
        (folder / f"Ebay_{split}.txt").write_text("\n".join(lines) + "\n")
    return root


def write_inshop(root: Path, rows: list[tuple[int, str]]) -> Path:
    """``Eval/list_eval_partition.txt`` with one line per ``(item, status)`` and ``Img/img/...`` images."""
    lines = [str(len(rows)), "image_name item_id evaluation_status"]
    for n, (item, status) in enumerate(rows):
        name = f"img/WOMEN/Dresses/id_{item:08d}/{n:02d}_1_front.jpg"
        _jpeg(root / "Img" / name, n)
        lines.append(f"{name}  id_{item:08d}  {status}")
    (root / "Eval").mkdir(parents=True, exist_ok=True)
    (root / "Eval" / "list_eval_partition.txt").write_text("\n".join(lines) + "\n")
    return root


def write_cars_csvs(root: Path, per_class: int = 2, classes: int = 196) -> Path:
    """pytorch-metric-learning's Cars196 copy: ``names.csv``, ``anno_{train,test}.csv`` (``<file>,x1,y1,x2,y2,<class>``)
    and ``car_data/car_data/<part>/<class name, '/' -> '-'>/<file>``; a class name with a ``/`` as the real
    ``Ram C/V Cargo Van Minivan 2012``. Even images of each class are in train, odd ones in test."""
    names = [f"Make {c} C/V {2000 + c}" if c % 50 == 0 else f"Make {c} Sedan {2000 + c}" for c in range(1, classes + 1)]
    (root).mkdir(parents=True, exist_ok=True)
    (root / "names.csv").write_text("\n".join(names) + "\n")
    lines: dict[str, list[str]] = {"train": [], "test": []}
    for c in range(1, classes + 1):
        for j in range(per_class):
            part = "train" if j % 2 == 0 else "test"
            name = f"{len(lines[part]) + 1:05d}.jpg"
            _jpeg(root / "car_data" / "car_data" / part / names[c - 1].replace("/", "-") / name, c * 10 + j)
            lines[part].append(f"{name},1,2,30,40,{c}")
    for part, rows in lines.items():
        (root / f"anno_{part}.csv").write_text("\n".join(rows) + "\n")
    return root
