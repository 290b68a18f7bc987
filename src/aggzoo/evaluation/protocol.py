"""The evaluation protocol of a model: input size, resize rule, normalisation, descriptor size, search metric.

The published VPR protocols evaluate at sizes that are multiples of the backbone's patch size or
stride (:mod:`aggzoo.models.input_size`): :func:`~aggzoo.models.input_size.snap_size` rounds a requested
size to the nearest multiple of :func:`~aggzoo.models.input_size.size_multiple`. The resize is
bicubic (or bilinear, where the authors' code says so) with antialiasing, as
``torchvision.transforms.Resize(..., antialias=True)`` does on PIL images in those codebases:
:func:`protocol_transform` uses PIL's resampling, which is exactly that operation. A single int is a
short side (the aspect ratio kept), as ``--image_size 322`` of gmberton/VPR-methods-evaluation.

:class:`EvalProtocol` is that choice for one model, filled from its
:class:`~aggzoo.hub.cfg.PretrainedCfg` (``input_size``, ``eval_resize``, ``interpolation``, ``mean``,
``std``, ``out_dim``, ``eval_metric``, ``eval_whitening_kind``: how its metrics were measured) with any
field overridden by the caller.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import torch
from PIL import Image
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torch import Tensor

from aggzoo.data.transforms import eval_transform
from aggzoo.errors import ConfigError
from aggzoo.evaluation.options import check_metric
from aggzoo.evaluation.postprocess import check_whitening_kind
from aggzoo.hub.cfg import PretrainedCfg
from aggzoo.models.input_size import snap_size

__all__ = ["PROTOCOL_FIELDS", "RESIZE_RULES", "SIDES", "EvalProtocol", "long_side_size", "protocol_transform",
           "short_side_size"]

#: ``"protocol"``: PIL resize with antialiasing, sides snapped (the published protocols);
#: ``"pipeline"``: aggzoo's training-pipeline resize (:func:`aggzoo.data.transforms.eval_transform`)
RESIZE_RULES = ("protocol", "pipeline")
_PIL_FILTERS = {"bicubic": Image.Resampling.BICUBIC, "bilinear": Image.Resampling.BILINEAR,
                "nearest": Image.Resampling.NEAREST, "area": Image.Resampling.BOX,
                "lanczos": Image.Resampling.LANCZOS}
#: what an int ``image_size`` sizes: the short side (VPR: ``--image_size 322`` of VPR-methods-evaluation) or the
#: long side (image retrieval: cirtorch / revisitop's 1024, an image never enlarged)
SIDES = ("short", "long")


def short_side_size(height: int, width: int, short_side: int, multiple: int = 1) -> tuple[int, int]:
    """``(h, w)`` with the short side ``short_side`` and the aspect ratio kept, both snapped to ``multiple``:
    ``(480, 640), 322 -> (322, 429)``, then ``(322, 434)`` with ``multiple=14``."""
    scale = short_side / min(height, width)
    return snap_size((height * scale, width * scale), multiple)


def long_side_size(height: int, width: int, long_side: float, multiple: int = 1) -> tuple[int, int]:
    """``(h, w)`` of an image shrunk so that its long side is at most ``long_side``, the aspect ratio kept and
    never enlarged -- PIL's ``Image.thumbnail((long_side, long_side))``, which cirtorch's and revisitop's
    ``imresize`` call -- then snapped to ``multiple`` (a ViT's patch size; 1 for a CNN)."""
    probe = Image.new("1", (width, height))  # 1 bit per pixel: the size rule of thumbnail, without the pixels' cost
    probe.thumbnail((long_side, long_side))
    return snap_size((probe.height, probe.width), multiple) if multiple > 1 else (probe.height, probe.width)


class _PILResize:
    """``rgb uint8 [H, W, 3] -> float [3, h, w]``: PIL resize (antialiased) + normalisation.

    ``size`` is a fixed ``(h, w)``; else ``side_length`` sizes each image's short side (``side="short"``:
    aspect kept, snapped), or shrinks its long side to it (``side="long"``: PIL's thumbnail, as cirtorch's
    ``imresize``). Under ``side="long"`` a cropped image (a revisited Oxford/Paris query cut to its box) is
    scaled by its full image's factor: ``side_length * max(crop) / max(full)``, as cirtorch's
    ``ImagesFromList`` does, so a query crop is not blown up to the database images' size."""

    #: :class:`aggzoo.data.retrieval_set.ImageListDataset` passes a cropped image's full size (``full_size=``)
    scales_crops_as_full_image = True

    def __init__(self, size: tuple[int, int] | None, mean: Sequence[float], std: Sequence[float], *,
                 interpolation: str = "bicubic", side_length: int | None = None, side: str = "short",
                 multiple: int = 1) -> None:
        self.size = size
        self.side_length = side_length
        self.side = side
        self.multiple = multiple
        self.interpolation = interpolation
        self.mean = np.asarray(mean, dtype=np.float32).reshape(3, 1, 1)
        self.std = np.asarray(std, dtype=np.float32).reshape(3, 1, 1)

    def __call__(self, image: np.ndarray, full_size: tuple[int, int] | None = None) -> Tensor:
        height, width = image.shape[:2]
        if self.size is not None:
            height, width = self.size
        elif self.side == "long":
            length = float(self.side_length)
            if full_size is not None:  # a crop: its full image's scale (cirtorch)
                length *= max(image.shape[:2]) / max(full_size)
            height, width = long_side_size(height, width, length, self.multiple)
        else:
            height, width = short_side_size(height, width, int(self.side_length), self.multiple)
        resized = np.asarray(Image.fromarray(image).resize((width, height), _PIL_FILTERS[self.interpolation]))
        chw = resized.transpose(2, 0, 1).astype(np.float32) / 255.0
        return torch.from_numpy(np.ascontiguousarray((chw - self.mean) / self.std))

    def __repr__(self) -> str:
        size = f"size={self.size}" if self.size is not None else f"{self.side}_side={self.side_length}"
        # the multiple sizes a side (the descriptor cache keys by this text); said only where it snaps per image
        snapped = f", multiple={self.multiple}" if self.size is None and self.multiple != 1 else ""
        return f"protocol_transform({size}{snapped}, {self.interpolation}, antialias)"


def protocol_transform(
    image_size: int | Sequence[int] | None = None,
    *,
    multiple: int = 1,
    mean: Sequence[float] = IMAGENET_DEFAULT_MEAN,
    std: Sequence[float] = IMAGENET_DEFAULT_STD,
    interpolation: str = "bicubic",
    short_side: int | None = None,
    long_side: int | None = None,
) -> _PILResize:
    """The published evaluation transform: resize to ``snap_size(image_size, multiple)`` (an int: a
    square), or each image's short side to ``short_side`` (aspect kept, sides snapped), or shrink its long side
    to ``long_side`` (:func:`long_side_size`), with PIL (antialiased), scale to [0, 1], normalise. Picklable,
    for ``num_workers > 0``."""
    if interpolation not in _PIL_FILTERS:
        raise ConfigError(f"interpolation must be one of {sorted(_PIL_FILTERS)}, got {interpolation!r}")
    if sum(v is not None for v in (image_size, short_side, long_side)) != 1:
        raise ValueError("pass exactly one of image_size, short_side and long_side")
    size = snap_size(image_size, multiple) if image_size is not None else None
    side = "long" if long_side is not None else "short"
    return _PILResize(size, mean, std, interpolation=interpolation, side_length=short_side or long_side, side=side,
                      multiple=multiple)


def _as_size(value: Any) -> Any:
    """``322`` / ``[322]`` -> 322 (a short side); ``[H, W]`` -> ``(H, W)``; anything else as it is (refused
    by :class:`EvalProtocol` with the key named)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, Sequence) and not isinstance(value, str) and all(isinstance(v, int) for v in value):
        return value[0] if len(value) == 1 else tuple(value)
    return value


#: the fields of :class:`EvalProtocol` a caller may override (``eval.py evaluation.<field>=...``)
PROTOCOL_FIELDS = ("image_size", "side", "resize", "interpolation", "mean", "std", "descriptor_dim", "metric",
                   "whitening_kind", "multiple")


@dataclass(frozen=True)
class EvalProtocol:
    """How one model is evaluated.

    Attributes:
        image_size: ``(H, W)``, resized to exactly (snapped under ``resize="protocol"``); or an int, the
            ``side`` of every image (aspect ratio kept; images of one batch may then differ in size).
        side: what an int ``image_size`` sizes: ``"short"`` (the short side, VPR's convention) or ``"long"``
            (the long side, never enlarged, a query crop scaled as its full image: image retrieval's 1024).
        resize: ``"protocol"`` (PIL, antialiased, sides snapped to ``multiple``) or ``"pipeline"`` (aggzoo's
            evaluation resize, no snapping: what ``train.py`` measures its test metrics with).
        interpolation: ``bicubic`` | ``bilinear`` (| ``nearest``, ``area``).
        mean, std: normalisation of 0..1 RGB.
        descriptor_dim: the descriptor size the protocol states (checked against the model), or None.
        multiple: the model's side multiple (patch size or stride) the protocol resize snaps to.
        metric: the search metric, ``"ip"`` (inner product) or ``"l2"`` (squared L2 distance).
        whitening_kind: the PCA an ``evaluation.postprocess.whitening_fit`` fits: ``"whiten"`` (PCA-whitening + L2)
            or ``"project"`` (plain PCA projection, no L2, as sklearn's ``PCA``).
        source: where the fields come from, in words (the weights' cfg, the config, overrides).
    """

    image_size: tuple[int, int] | int
    resize: str = "pipeline"
    side: str = "short"
    interpolation: str = "bicubic"
    mean: tuple[float, float, float] = IMAGENET_DEFAULT_MEAN
    std: tuple[float, float, float] = IMAGENET_DEFAULT_STD
    descriptor_dim: int | None = None
    multiple: int = 1
    source: str = ""
    overridden: tuple[str, ...] = field(default=())
    metric: str = "ip"
    whitening_kind: str = "whiten"

    def __post_init__(self) -> None:
        check_metric(self.metric)
        check_whitening_kind(self.whitening_kind)
        if self.resize not in RESIZE_RULES:
            raise ConfigError(f"evaluation.protocol.resize: the resize rule must be one of {RESIZE_RULES} "
                              f"(true = protocol, false = pipeline), got {self.resize!r}")
        if self.side not in SIDES:
            raise ConfigError(f"evaluation.protocol.side={self.side!r}: use short (an int image_size is the short side) "
                              "or long (the long side, as image retrieval's 1024)")
        if self.interpolation not in _PIL_FILTERS:
            raise ConfigError(f"evaluation.protocol.interpolation={self.interpolation} is not one of {sorted(_PIL_FILTERS)}")
        size = self.image_size
        ok = (isinstance(size, int) and size > 0) or (
            isinstance(size, tuple) and len(size) == 2 and all(isinstance(s, int) and s > 0 for s in size))
        if not ok:
            raise ConfigError(f"evaluation.protocol.image_size={size!r} must be [H, W] (resize to that size) or one positive "
                              "int (the short side, aspect ratio kept), e.g. evaluation.protocol.image_size=[322,322]")
        if isinstance(size, int) and self.resize == "pipeline":
            raise ConfigError(f"evaluation.protocol.image_size={size} (a short side) needs the protocol resize: add "
                              "evaluation.protocol.resize=true, or give [H, W]")
        for name in ("mean", "std"):
            value = getattr(self, name)
            if len(value) != 3 or (name == "std" and min(value) <= 0):
                raise ConfigError(f"evaluation.{name}={list(value)} must be three numbers (RGB on 0..1)"
                                  + (", all > 0" if name == "std" else ""))

    @classmethod
    def from_pretrained_cfg(cls, cfg: PretrainedCfg, *, multiple: int = 1) -> EvalProtocol:
        """The protocol its weights were measured with (the cfg's input size, resize rule, normalisation)."""
        return cls(image_size=(int(cfg.input_size[1]), int(cfg.input_size[2])), resize=cfg.eval_resize,
                   interpolation=cfg.interpolation, mean=tuple(cfg.mean), std=tuple(cfg.std),
                   descriptor_dim=cfg.out_dim, multiple=multiple, source=f"the pretrained cfg of {cfg.name}",
                   metric=cfg.eval_metric, whitening_kind=cfg.eval_whitening_kind)

    def overridden_by(self, overrides: Mapping[str, Any]) -> EvalProtocol:
        """A copy with the non-``None`` ``overrides`` (keys of :data:`PROTOCOL_FIELDS`) applied."""
        unknown = sorted(set(overrides) - set(PROTOCOL_FIELDS))
        if unknown:
            raise ConfigError(f"{unknown[0]} is not a field of the evaluation protocol; the fields are {list(PROTOCOL_FIELDS)}")
        values = {k: v for k, v in overrides.items() if v is not None}
        if "image_size" in values:
            values["image_size"] = _as_size(values["image_size"])
        if "multiple" in values:
            values["multiple"] = int(values["multiple"])
            if values["multiple"] < 1:
                raise ConfigError(f"evaluation.protocol.multiple must be >= 1, got {values['multiple']}")
        for key in ("mean", "std"):
            if key in values:
                values[key] = tuple(float(v) for v in values[key])
        if not values:
            return self
        return replace(self, **values, overridden=tuple(sorted({*self.overridden, *values})))

    @property
    def fixed_size(self) -> bool:
        """Every image comes out the same size (so images batch together)."""
        return not isinstance(self.image_size, int)

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        """The ``(h, w)`` an image of ``height x width`` is resized to."""
        if isinstance(self.image_size, int) and self.side == "long":
            return long_side_size(height, width, self.image_size, self.multiple)
        if isinstance(self.image_size, int):
            return short_side_size(height, width, self.image_size, self.multiple)
        if self.resize == "protocol":
            return snap_size(self.image_size, self.multiple)
        return self.image_size

    def transform(self) -> Callable[[np.ndarray], Tensor]:
        """``rgb uint8 [H, W, 3] -> float [3, h, w]`` (picklable, for DataLoader workers)."""
        if self.resize == "pipeline":
            return eval_transform(self.image_size, mean=self.mean, std=self.std, interpolation=self.interpolation)
        if isinstance(self.image_size, int):
            side = {"short_side" if self.side == "short" else "long_side": self.image_size}
            return protocol_transform(multiple=self.multiple, mean=self.mean, std=self.std,
                                      interpolation=self.interpolation, **side)
        return protocol_transform(self.image_size, multiple=self.multiple, mean=self.mean, std=self.std,
                                  interpolation=self.interpolation)

    def describe(self) -> str:
        """One line: ``120x160, pipeline resize (bicubic), mean [...], std [...]``."""
        size = (f"{self.side} side {self.image_size}" if isinstance(self.image_size, int)
                else "x".join(map(str, self.output_size(*self.image_size))))
        rule = f"PIL resize, sides snapped to {self.multiple}" if self.resize == "protocol" else "pipeline resize"
        return (f"{size}, {rule} ({self.interpolation}), mean {list(self.mean)}, std {list(self.std)}"
                + (f", {self.descriptor_dim}-D" if self.descriptor_dim else "")
                + (", L2-distance search" if self.metric == "l2" else ""))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (``results.json``'s ``meta.protocol``)."""
        out = asdict(self)
        out["image_size"] = self.image_size if isinstance(self.image_size, int) else list(self.image_size)
        out["short_side"] = isinstance(self.image_size, int) and self.side == "short"
        out["mean"], out["std"], out["overridden"] = list(self.mean), list(self.std), list(self.overridden)
        return out
