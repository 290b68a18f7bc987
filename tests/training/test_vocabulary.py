"""``aggzoo vocabulary``: AnyLoc's vocabulary fitted from real image files, written, and loaded back."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import faiss
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from image_files import write_noise_images
from safetensors import safe_open
from shared_paths import NORDLAND_MINI
from torchvision.transforms.functional import center_crop

import aggzoo
from aggzoo.cli.main import main
from aggzoo.cli.vocabulary import with_clusters
from aggzoo.data.images import read_rgb
from aggzoo.data.transforms import CentreCropToMultiple, eval_transform
from aggzoo.errors import StateDictMismatchError
from aggzoo.training.vocabulary import VocabularyOptions, fit_vocabulary, vocabulary_transform

#: a two-level-deep tiny ViT (patch 16, 64 channels) reading block 3's value facet
TINY = {"model_name": "test_vit", "block": 3, "facet": "value", "frozen_stages": 0, "img_size": 224}
NORDLAND_QUERIES = NORDLAND_MINI / "vg" / "images" / "test" / "queries"


def _tiny(clusters: int = 4) -> torch.nn.Module:
    torch.manual_seed(0)
    return aggzoo.create_model("anyloc_dinov2_vitg14", backbone_kwargs=TINY, num_clusters=clusters)


@pytest.fixture(scope="module")
def noise_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("vocabulary_images")
    write_noise_images(folder, 6, (70, 100, 3), seed=0, name="a{i}.png")
    (folder / "sub").mkdir()
    write_noise_images(folder / "sub", 3, (90, 60, 3), seed=1, name="b{i}.jpg")
    (folder / "notes.txt").write_text("not an image")
    return folder


def _expected_centres(descriptors: torch.Tensor, clusters: int, seed: int) -> torch.Tensor:
    """Cosine k-means as AnyLoc fits it, computed here directly with faiss on every point, then the members'
    means (fast_pytorch_kmeans keeps means, not unit vectors), by brute force."""
    data = np.ascontiguousarray(descriptors.numpy())
    km = faiss.Kmeans(data.shape[1], clusters, niter=100, seed=seed, spherical=True,
                      max_points_per_centroid=data.shape[0])
    km.train(data)
    centres = torch.from_numpy(km.centroids)
    words = (F.normalize(descriptors, dim=1) @ F.normalize(centres, dim=1).T).argmax(dim=1)
    out = torch.zeros_like(centres)
    for k in range(clusters):
        if (words == k).any():
            out[k] = F.normalize(descriptors[words == k], dim=1).mean(dim=0)
    return out


def test_centre_crop_to_multiple_is_torchvisions_centre_crop() -> None:
    image = np.random.default_rng(0).integers(0, 256, (75, 101, 3), dtype=np.uint8)
    inner = eval_transform((75, 101))
    cropped = CentreCropToMultiple(inner, 14)(image)
    assert tuple(cropped.shape) == (3, 70, 98)
    assert torch.equal(cropped, center_crop(inner(image), [70, 98]))


def test_fit_clusters_every_local_feature_and_keeps_the_kmeans_means(noise_folder: Path) -> None:
    model = _tiny()
    paths = sorted(p for p in noise_folder.rglob("*") if p.suffix in (".png", ".jpg"))
    options = VocabularyOptions(image_size=(64, 96), every=2)
    fit = fit_vocabulary(model, paths, options)
    chosen = paths[::2]
    assert fit.images == len(chosen) and fit.modules == ("head",)
    # every position of every chosen image (4 x 6 patches of 16 px), computed here image by image
    transform = vocabulary_transform(model, (64, 96))
    with torch.no_grad():
        maps = [model.backbone.eval()(transform(read_rgb(p))[None]).last for p in chosen]
    local = torch.cat([F.normalize(m.flatten(2)[0].T, dim=1) for m in maps])
    assert fit.descriptors.shape == (len(chosen) * 24, 64)
    torch.testing.assert_close(fit.descriptors.sum(dim=0), local.sum(dim=0), atol=1e-4, rtol=0)
    torch.testing.assert_close(model.head.centroids, _expected_centres(fit.descriptors, 4, seed=0), atol=1e-5, rtol=0)


def test_command_writes_a_file_create_model_loads(noise_folder: Path, tmp_path: Path) -> None:
    saved = tmp_path / "tiny"
    aggzoo.save_pretrained(_tiny(), saved)
    out = tmp_path / "vocab" / "noise.safetensors"
    assert main(["vocabulary", f"local-dir:{saved}", str(noise_folder), "--clusters", "3", "--out", str(out),
                 "--image-size", "64", "96"]) == 0
    with safe_open(str(out), framework="pt") as file:
        keys = set(file.keys())
    assert "head.centroids" in keys and any(k.startswith("backbone.") for k in keys)  # a random backbone travels with it
    loaded = aggzoo.create_model(str(out))
    named = aggzoo.create_model("anyloc_dinov2_vitg14", backbone_kwargs=TINY, num_clusters=3, checkpoint_path=out)
    # the same fit, done here through the API on the same model and images
    reference = with_clusters(aggzoo.create_model(f"local-dir:{saved}"), 3)  # the saved backbone, 3 centres
    fit_vocabulary(reference, sorted(p for p in noise_folder.rglob("*") if p.suffix in (".png", ".jpg")),
                   VocabularyOptions(image_size=(64, 96)))
    assert loaded.head.centroids.shape == (3, 64)
    torch.testing.assert_close(loaded.head.centroids, reference.head.centroids, atol=0, rtol=0)
    images = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        torch.testing.assert_close(named(images), loaded(images), atol=0, rtol=0)
        torch.testing.assert_close(loaded(images), reference.eval()(images), atol=0, rtol=0)


@pytest.mark.skipif(not NORDLAND_QUERIES.is_dir(), reason=f"real images absent: {NORDLAND_QUERIES} (AGGZOO_SHARED_DATA)")
def test_command_on_real_nordland_images(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = tmp_path / "tiny"
    aggzoo.save_pretrained(_tiny(8), saved)
    out = tmp_path / "nordland.safetensors"
    assert main(["vocabulary", f"local-dir:{saved}", str(NORDLAND_QUERIES), "--out", str(out), "--every", "40",
                 "--image-size", "128", "128"]) == 0
    images = len(sorted(NORDLAND_QUERIES.glob("*.jpg"))[::40])
    assert f"from {images * 64} local features (64-D) of {images} images" in capsys.readouterr().out
    model = aggzoo.create_model(str(out))
    paths = sorted(NORDLAND_QUERIES.glob("*.jpg"))[::40]
    transform = vocabulary_transform(model, (128, 128))
    with torch.no_grad():
        local = torch.cat([F.normalize(model.backbone.eval()(transform(read_rgb(p))[None]).last.flatten(2)[0].T, dim=1)
                           for p in paths])
    # the file's centres are the members' means of cosine k-means over exactly these features
    words = (local @ F.normalize(model.head.centroids, dim=1).T).argmax(dim=1)
    used = words.unique()
    assert len(used) >= 6
    for k in used:
        torch.testing.assert_close(model.head.centroids[k], local[words == k].mean(dim=0), atol=2e-3, rtol=0)


def test_a_pretrained_backbone_is_left_out_of_the_file(noise_folder: Path, tmp_path: Path) -> None:
    """A registered name is built with its backbone's own (offline) pretrained weights: the file holds only
    the head, and both ways of loading it put that backbone back."""
    out = tmp_path / "netvlad.safetensors"
    assert main(["vocabulary", "netvlad_efficientnet_lite0", str(noise_folder), "--clusters", "4", "--out", str(out),
                 "--image-size", "64", "96"]) == 0
    with safe_open(str(out), framework="pt") as file:
        assert sorted(file.keys()) == ["head.centroids", "head.conv.weight"]
    pretrained = aggzoo.create_model("netvlad_efficientnet_lite0", pretrained_backbone=True, num_clusters=4).eval()
    from_file = aggzoo.create_model(str(out))
    named = aggzoo.create_model("netvlad_efficientnet_lite0", pretrained_backbone=True, num_clusters=4,
                                checkpoint_path=out)
    for key, value in pretrained.backbone.state_dict().items():
        assert torch.equal(from_file.backbone.state_dict()[key], value), key
    images = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        torch.testing.assert_close(named(images), from_file(images), atol=0, rtol=0)
    with pytest.raises(StateDictMismatchError, match="missing keys"):  # a random backbone is not silently kept
        aggzoo.create_model("netvlad_efficientnet_lite0", num_clusters=4, checkpoint_path=out)


def test_a_bad_image_folder_is_one_error_line(tmp_path: Path) -> None:
    saved = tmp_path / "tiny"
    aggzoo.save_pretrained(_tiny(), saved)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "readme.txt").write_text("no images here")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "photo.jpg").write_bytes(b"not a jpeg")
    for folder, reason in [(tmp_path / "missing", "no such folder"), (empty, "holds no image files"),
                           (saved / "config.json", "a file, not a folder"), (broken, "photo.jpg")]:
        result = subprocess.run([sys.executable, "-m", "aggzoo.cli.main", "vocabulary", f"local-dir:{saved}",
                                 str(folder), "--out", str(tmp_path / "v.safetensors")],
                                capture_output=True, text=True, timeout=300)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr
        assert reason in lines[0]
    assert not (tmp_path / "v.safetensors").exists()
