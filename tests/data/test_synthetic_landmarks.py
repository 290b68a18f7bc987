"""Tests of the synthetic landmark set: the revisitop layout, its ground truth, the query boxes against
the pixels drawn, determinism, the cache (reuse, a killed generation), its Hydra node, and that an
untrained baseline finds easy views easier than hard ones.

The files are read here with plain ``pickle``, ``csv`` and PIL, independent of the project's readers.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from aggzoo.data.synthetic_landmarks import (
    COMPLETE_FILE,
    DATASET,
    LANDMARK_IDS_FILE,
    SyntheticLandmarksConfig,
    default_landmarks_root,
    ensure_synthetic_landmarks,
    generate_synthetic_landmarks,
    synthetic_landmarks_root,
)
from aggzoo.errors import ConfigError, UserError

TINY = SyntheticLandmarksConfig(seed=2, landmarks=3, queries_per_landmark=2, easy_per_landmark=2,
                                hard_per_landmark=3, junk_per_landmark=2, lookalikes_per_landmark=1,
                                street_scenes=3, image_size=(96, 72))
GND = f"gnd_{DATASET}.pkl"


@pytest.fixture(scope="module")
def lm_set(tmp_path_factory) -> Path:
    return generate_synthetic_landmarks(tmp_path_factory.mktemp("lm") / DATASET, TINY, workers=1)


@pytest.fixture(scope="module")
def gnd(lm_set: Path) -> dict:
    with open(lm_set / GND, "rb") as fh:
        return pickle.load(fh)


def _hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


class _NoGlobals(pickle.Unpickler):
    def find_class(self, module, name):
        raise AssertionError(f"the pickle names {module}.{name}")


def test_files_in_revisitop_layout(lm_set: Path, gnd: dict) -> None:
    assert set(gnd) == {"imlist", "qimlist", "gnd"}
    assert all(isinstance(n, str) and not n.endswith(".jpg") for n in gnd["imlist"] + gnd["qimlist"])
    assert not set(gnd["imlist"]) & set(gnd["qimlist"]), "queries are not database images (revisitop)"
    n_db = TINY.landmarks * (TINY.easy_per_landmark + TINY.hard_per_landmark + TINY.junk_per_landmark) + 2 * (
        TINY.landmarks * TINY.lookalikes_per_landmark + TINY.street_scenes)
    assert len(gnd["imlist"]) == len(set(gnd["imlist"])) == n_db
    assert len(gnd["qimlist"]) == len(gnd["gnd"]) == TINY.landmarks * TINY.queries_per_landmark
    # revisitop's configdataset: <dir>/jpg/<name> + '.jpg' for both lists, nothing else in jpg/
    assert sorted(p.name for p in (lm_set / "jpg").iterdir()) == sorted(n + ".jpg" for n in gnd["imlist"] + gnd["qimlist"])
    for name in gnd["imlist"][:5] + gnd["qimlist"]:
        with Image.open(lm_set / "jpg" / f"{name}.jpg") as im:
            assert im.format == "JPEG" and im.size == TINY.image_size
    for entry in gnd["gnd"]:
        assert set(entry) == {"bbx", "easy", "hard", "junk"}
        assert len(entry["bbx"]) == 4 and all(isinstance(v, float) for v in entry["bbx"])
        assert all(isinstance(i, int) for k in ("easy", "hard", "junk") for i in entry[k])
    # only dicts, lists, strings and numbers: a restricted unpickler (one that allows no global) reads it
    assert _NoGlobals(io.BytesIO((lm_set / GND).read_bytes())).load() == gnd


def test_ground_truth_lists(gnd: dict) -> None:
    n_db = len(gnd["imlist"])
    for entry in gnd["gnd"]:
        easy, hard, junk = (entry[k] for k in ("easy", "hard", "junk"))
        assert (len(easy), len(hard), len(junk)) == (TINY.easy_per_landmark, TINY.hard_per_landmark, TINY.junk_per_landmark)
        together = easy + hard + junk
        assert len(set(together)) == len(together), "easy / hard / junk overlap"
        assert all(0 <= i < n_db for i in together)
    # queries of one landmark share their lists; different landmarks share nothing
    lists = {tuple(sorted(e["easy"] + e["hard"] + e["junk"])) for e in gnd["gnd"]}
    assert len(lists) == TINY.landmarks
    assert len(set().union(*lists)) == sum(len(s) for s in lists)


def test_landmark_ids_csv(lm_set: Path, gnd: dict) -> None:
    with open(lm_set / LANDMARK_IDS_FILE, newline="") as fh:
        reader = csv.DictReader(fh)
        assert reader.fieldnames == ["landmark_id", "images"]
        classes = {int(row["landmark_id"]): row["images"].split(" ") for row in reader}
    names = [n for images in classes.values() for n in images]
    assert sorted(names) == sorted(gnd["imlist"]), "every database image under exactly one id"
    assert len(classes) == TINY.landmarks * (1 + TINY.lookalikes_per_landmark) + TINY.street_scenes
    assert min(len(v) for v in classes.values()) >= 2
    for q, entry in enumerate(gnd["gnd"]):
        shown = {gnd["imlist"][i] for i in entry["easy"] + entry["hard"] + entry["junk"]}
        assert shown == set(classes[q // TINY.queries_per_landmark]), "a landmark's id holds exactly its photographs"


def _photo(config: SyntheticLandmarksConfig, name: str):
    from aggzoo.data.synthetic_landmarks import _plan

    for job in _plan(config):
        for photo in job.photos:
            if photo.name == name:
                return job, photo
    raise AssertionError(name)


def _render(config: SyntheticLandmarksConfig, name: str, with_subject: bool):
    """The photograph ``name`` rendered again in memory (before JPEG), with or without its subject building."""
    from aggzoo.data.synthetic_landmarks import _canvas_size, _photograph, _render_scene

    job, photo = _photo(config, name)
    scene, mask = _render_scene(job, *_canvas_size(config.image_size), with_subject=with_subject)
    image, box = _photograph(scene, mask, photo, config.image_size, config.difficulty)
    return np.asarray(image, np.int16), box


def _changed_box(config, name):
    with_, box = _render(config, name, True)
    without, _ = _render(config, name, False)
    ys, xs = np.nonzero(np.abs(with_ - without).max(axis=2) > 0)
    return (xs, ys), box, with_


def test_query_boxes_are_inside_and_frame_the_landmark_pixels(lm_set: Path, gnd: dict) -> None:
    """Pixel-exact against the drawing: rendering a query again without its landmark changes only pixels
    inside its bbx, and those pixels fill the box (IoU >= 0.9)."""
    w, h = TINY.image_size
    for name, entry in zip(gnd["qimlist"], gnd["gnd"]):
        x1, y1, x2, y2 = entry["bbx"]
        assert 0 <= x1 < x2 <= w and 0 <= y1 < y2 <= h, entry["bbx"]
        assert 0.05 < (x2 - x1) * (y2 - y1) / (w * h) < 0.8, "the query shows its landmark and surroundings"
        (xs, ys), box, rendered = _changed_box(TINY, name)
        assert box == entry["bbx"]
        encoded = io.BytesIO()
        Image.fromarray(rendered.astype(np.uint8)).save(encoded, format="JPEG", quality=TINY.jpeg_quality)
        assert encoded.getvalue() == (lm_set / "jpg" / f"{name}.jpg").read_bytes(), "the file is this rendering"
        assert xs.min() >= x1 and xs.max() < x2 and ys.min() >= y1 and ys.max() < y2
        cx1, cy1, cx2, cy2 = max(xs.min(), x1), max(ys.min(), y1), min(xs.max() + 1, x2), min(ys.max() + 1, y2)
        iou = (cx2 - cx1) * (cy2 - cy1) / ((x2 - x1) * (y2 - y1))
        assert iou >= 0.9, (name, entry["bbx"], iou)


def test_junk_shows_the_landmark_only_partly(gnd: dict) -> None:
    """A junk photograph contains some of its landmark, cut by the frame; an easy one shows it whole enough
    to fill a good part of the image."""
    w, h = TINY.image_size
    for entry in gnd["gnd"][::TINY.queries_per_landmark]:
        for i in entry["junk"]:
            (xs, ys), _, _ = _changed_box(TINY, gnd["imlist"][i])
            assert xs.size > 0, "the landmark is in view"
            assert xs.min() == 0 or ys.min() == 0 or xs.max() == w - 1 or ys.max() == h - 1, "cut by the frame"
        for i in entry["easy"]:
            (xs, ys), _, _ = _changed_box(TINY, gnd["imlist"][i])
            assert (xs.max() - xs.min()) >= 0.4 * w


def test_deterministic_independent_of_workers_and_seeded(lm_set: Path, tmp_path: Path) -> None:
    again = generate_synthetic_landmarks(tmp_path / "again", TINY, workers=2)
    assert _hashes(again) == _hashes(lm_set)
    other = generate_synthetic_landmarks(tmp_path / "other", SyntheticLandmarksConfig(**{**TINY.to_dict(), "seed": 3}),
                                         workers=1)
    ours = {h for p, h in _hashes(lm_set).items() if p.endswith(".jpg")}
    assert not ours & {h for p, h in _hashes(other).items() if p.endswith(".jpg")}


def _age(root: Path) -> list[Path]:
    files = [p for p in root.rglob("*") if p.is_file()]
    for p in files:
        os.utime(p, ns=(1_000_000_000, 1_000_000_000))
    return files


def test_cache_is_reused_and_keyed_by_config(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AGGZOO_DATA", str(tmp_path))
    root = synthetic_landmarks_root(TINY)
    assert root == tmp_path / DATASET / TINY.digest() == default_landmarks_root(TINY)
    assert (root / GND).is_file() and (root / COMPLETE_FILE).is_file()
    files = _age(root)
    assert synthetic_landmarks_root(TINY) == root
    assert all(p.stat().st_mtime_ns == 1_000_000_000 for p in files), "a complete set is not rewritten"
    assert default_landmarks_root(SyntheticLandmarksConfig(**{**TINY.to_dict(), "seed": 9})) != root
    # a set that lost an image is not trusted
    next((root / "jpg").glob("*.jpg")).unlink()
    ensure_synthetic_landmarks(root, TINY, workers=1)
    assert len(list((root / "jpg").glob("*.jpg"))) == len(files) - 4  # 4 = gnd, csv, config, marker


_KILL_ME = """
import json, sys
from aggzoo.data.synthetic_landmarks import SyntheticLandmarksConfig, generate_synthetic_landmarks
generate_synthetic_landmarks(sys.argv[1], SyntheticLandmarksConfig(**json.loads(sys.argv[2])), workers=1)
"""


def test_killed_generation_never_looks_complete(tmp_path: Path) -> None:
    """SIGKILL in the middle of writing images: no folder at the root (the set is renamed into place
    only when complete), and the next use generates the whole set and clears the left-over."""
    config = SyntheticLandmarksConfig(**{**TINY.to_dict(), "street_scenes": 30})
    root = tmp_path / DATASET
    proc = subprocess.Popen([sys.executable, "-c", _KILL_ME, str(root), json.dumps(config.to_dict())],
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    deadline = time.monotonic() + 120
    while sum(1 for _ in tmp_path.glob(f".{DATASET}.partial-*/jpg/*.jpg")) < 5 and time.monotonic() < deadline:
        assert proc.poll() is None, "the generation ended before it could be killed"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert not root.exists()
    assert list(tmp_path.glob(f".{DATASET}.partial-*")), "the half-written set stayed hidden"
    ensure_synthetic_landmarks(root, config, workers=1)
    assert (root / COMPLETE_FILE).is_file()
    assert not list(tmp_path.glob(f".{DATASET}.partial-*"))


def test_refuses_foreign_folder(tmp_path: Path) -> None:
    (tmp_path / "mine.txt").write_text("not a generated set")
    with pytest.raises(FileExistsError, match="not written by"):
        generate_synthetic_landmarks(tmp_path, TINY, workers=1)
    assert (tmp_path / "mine.txt").exists()


def test_invalid_config_is_a_user_error() -> None:
    with pytest.raises(ConfigError, match="easy_per_landmark") as err:
        SyntheticLandmarksConfig(easy_per_landmark=0)
    assert isinstance(err.value, UserError)


@pytest.mark.parametrize("job", ["eval", "train"])
def test_hydra_benchmark_node_generates_its_root(job: str, monkeypatch, tmp_path: Path) -> None:
    """conf/benchmark/synthetic_landmarks.yaml composed from the real conf/ (synthetic_landmarks=tiny): the
    revisitop reader on the generated root. The reader lives in aggzoo.data.revisitop; here its root
    node is instantiated, which generates the set."""
    from hydra.utils import instantiate
    from hydra_helpers import compose_run_config

    monkeypatch.setenv("AGGZOO_DATA", str(tmp_path / "cache"))
    key = "benchmark" if job == "eval" else "benchmark@test_benchmarks"
    cfg = compose_run_config(job, [f"{key}=[synthetic_landmarks]", "synthetic_landmarks=tiny"], tmp_path / "run")
    node = cfg["benchmark" if job == "eval" else "test_benchmarks"].synthetic_landmarks
    assert node._target_ == "aggzoo.data.revisitop.load_revisitop" and node.dataset == node.name == DATASET
    root = instantiate(node.root)
    tiny = SyntheticLandmarksConfig(landmarks=3, queries_per_landmark=2, easy_per_landmark=2, hard_per_landmark=2,
                                    junk_per_landmark=1, lookalikes_per_landmark=1, street_scenes=4, image_size=(96, 72))
    assert Path(root) == tmp_path / "cache" / DATASET / tiny.digest()
    assert (Path(root) / f"gnd_{node.dataset}.pkl").is_file()


@pytest.mark.slow
def test_untrained_baseline_finds_easy_views_easier_than_hard(tmp_path: Path) -> None:
    """Learnable but not trivial, measured with ImageNet EfficientNet-Lite0 features and global average
    pooling (queries cropped to bbx): on average the easy positives are closer to their query than the
    negatives, and the hard positives are farther than the easy ones. Weak inequalities on purpose; the
    figures themselves are in the module docstring."""
    import torch

    from aggzoo.models.backbones.timm_backbone import TimmBackbone

    config = SyntheticLandmarksConfig(seed=1, landmarks=6, street_scenes=12, image_size=(160, 120))
    root = generate_synthetic_landmarks(tmp_path / DATASET, config)
    with open(root / GND, "rb") as fh:
        gt = pickle.load(fh)
    backbone = TimmBackbone("tf_efficientnet_lite0", pretrained=True, out_indices=[-2]).eval()
    mean, std = torch.tensor([0.485, 0.456, 0.406])[:, None, None], torch.tensor([0.229, 0.224, 0.225])[:, None, None]

    def describe(images: list[Image.Image]) -> torch.Tensor:
        x = torch.stack([(torch.from_numpy(np.asarray(im.convert("RGB").resize((160, 120), Image.BILINEAR), np.float32)
                                           / 255).permute(2, 0, 1) - mean) / std for im in images])
        with torch.no_grad():
            return torch.nn.functional.normalize(backbone(x).maps[-1].mean((2, 3)), dim=1)

    db = describe([Image.open(root / "jpg" / f"{n}.jpg") for n in gt["imlist"]])
    queries = describe([Image.open(root / "jpg" / f"{n}.jpg").crop(e["bbx"]) for n, e in zip(gt["qimlist"], gt["gnd"])])
    sims = (queries @ db.T).numpy()
    easy, hard, negative = [], [], []
    for s, e in zip(sims, gt["gnd"]):
        others = np.ones(len(s), bool)
        others[e["easy"] + e["hard"] + e["junk"]] = False
        easy.append(s[e["easy"]].mean())
        hard.append(s[e["hard"]].mean())
        negative.append(s[others].mean())
    assert np.mean(easy) > np.mean(negative), (np.mean(easy), np.mean(negative))
    assert np.mean(hard) < np.mean(easy), (np.mean(hard), np.mean(easy))
