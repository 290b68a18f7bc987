"""``convert_pooling``: swap a network's max / average downsampling layers for generalized pooling.

A model transform like :func:`aggzoo.models.tlc.convert_tlc`, but for training: every ``nn.MaxPool2d``
and ``nn.AvgPool2d`` (local windows; global pooling is a head's business) becomes a
:mod:`aggzoo.layers.generalized_pooling` layer with the same window, stride and padding, whose few
parameters then train with the network (Lee et al., AISTATS 2016). Mixed pooling starts as the layer
it replaces (``a = 1`` for max, ``0`` for average), so a pretrained network's outputs are unchanged at
step 0; gated pooling starts as the half-half mix, tree pooling close to the average.

``TimmBackbone(..., pooling="gated")`` applies it when the backbone is built (``backbone.pooling=``
on the command line), so the spec in every checkpoint rebuilds the same layers.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from aggzoo.layers.generalized_pooling import GatedPool2d, MixedPool2d, TreePool2d, WindowPool2d

__all__ = ["POOLING_KINDS", "convert_pooling"]

POOLING_KINDS: dict[str, type[WindowPool2d]] = {"mixed": MixedPool2d, "gated": GatedPool2d, "tree": TreePool2d}


def _replacement(name: str, layer: nn.MaxPool2d | nn.AvgPool2d, cls: type[WindowPool2d], options: dict[str, Any]) -> nn.Module:
    dilation = getattr(layer, "dilation", 1)
    if dilation not in (1, (1, 1)):
        raise ValueError(f"convert_pooling: {name} ({layer}) is dilated, which generalized pooling does not "
                         "reproduce; convert a model without dilated pooling")
    is_max = isinstance(layer, nn.MaxPool2d)
    count_include_pad = True if is_max else layer.count_include_pad
    kwargs = dict(options)
    if cls is MixedPool2d:
        kwargs.setdefault("mix", 1.0 if is_max else 0.0)
    return cls(layer.kernel_size, layer.stride, layer.padding, count_include_pad=count_include_pad,
               ceil_mode=layer.ceil_mode, **kwargs)


def convert_pooling(model: nn.Module, kind: str, **options: Any) -> nn.Module:
    """Replace every local ``nn.MaxPool2d`` / ``nn.AvgPool2d`` in ``model`` (in place) and return it.

    Args:
        kind: ``"mixed"``, ``"gated"`` or ``"tree"``.
        **options: passed to the layer (``levels=3`` for a 3-level tree, ``mix=`` for mixed).

    Raises:
        ValueError: an unknown kind, a model with no such layer, or a dilated one.
    """
    if kind not in POOLING_KINDS:
        raise ValueError(f"pooling kind must be one of {', '.join(POOLING_KINDS)}, got {kind!r}")
    cls = POOLING_KINDS[kind]
    targets = [(name, module) for name, module in model.named_modules() if type(module) in (nn.MaxPool2d, nn.AvgPool2d)]
    if not targets:
        raise ValueError(f"convert_pooling: {type(model).__name__} has no nn.MaxPool2d / nn.AvgPool2d layer to replace")
    for name, layer in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, _replacement(name, layer, cls, options))
    return model
