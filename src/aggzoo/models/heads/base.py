"""The head contract: ``Features -> [B, D]`` L2-normalised descriptors, and what a head needs.

A head declares on its class what it needs from the backbone and from training, so that no list
elsewhere names it: the model builder, preflight (:mod:`aggzoo.run.preflight`), the data-init
callback, the optimiser's parameter groups, the contract tests and ``benchmarks/heads.py`` all read
these declarations.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from torch import Tensor, nn

from aggzoo.models.data_init import DataInit, DataInitDeclaring
from aggzoo.models.features import Features

__all__ = ["Head", "FeatureLevel", "DataInit"]

FeatureLevel = dict[str, Any]
"""One entry of a backbone's ``feature_info``: ``{"num_chs": int, "reduction": int, "module": str}``."""


class Head(DataInitDeclaring, nn.Module):
    """Base class of every aggregation head.

    Subclasses take ``in_channels`` as their first constructor argument (then keyword-only
    hyperparameters whose defaults are the paper's configuration), set ``self.out_dim`` and
    implement ``forward(features) -> [B, out_dim]`` with unit-norm rows (the documented exceptions, searched by
    L2 distance as their authors do: :class:`~aggzoo.models.heads.gem.GeM` with ``l2="before_pool"`` /
    ``"none"``, the dVGL benchmark's variants, and :class:`~aggzoo.models.heads.sage.SAGE` with its cross-image
    encoder and ``l2_after_encoder=False``, the released SAGE model). A head that needs several
    levels overrides :meth:`in_channels_from` so the model builder can hand it the right channels
    without any channel count being written in YAML.

    What a head needs (class-level declarations, safe defaults for a head that reads only the last map):

    - :attr:`needs_cls`: it reads ``features.cls`` (a ViT backbone with a class token);
    - :attr:`needs_tokens`: it reads ``features.tokens`` (a backbone that inserts aggregation tokens),
      :attr:`required_tokens` of them;
    - :attr:`needs_cls_attention`: it reads ``features.cls_attention`` (the last block's class-to-patch
      attention: :class:`~aggzoo.models.backbones.class_attention.ClassAttentionViT`, FoL);
    - :attr:`min_levels`: the fewest backbone levels (``features.maps``) it fuses;
    - :attr:`map_size_args` / :attr:`required_map_size`: the constructor arguments that fix the size
      of the last map, and the one ``(H, W)`` this instance was built for (MixVPR's ``in_h``/``in_w``);
    - :attr:`min_positions`: the fewest local features ``H*W`` of the last map it accepts;
    - :attr:`data_init` (from :class:`~aggzoo.models.data_init.DataInitDeclaring`): ``"none"``,
      ``"kmeans"`` or ``"pooled"`` initialisation from data before training, with the methods that
      kind calls;
    - :meth:`no_weight_decay` / :meth:`lr_multipliers`: parameter names, relative to the head, that
      train without weight decay or with a scaled learning rate (timm's ``no_weight_decay()`` pattern);
    - :attr:`batch_dependent`: an image's descriptor depends on the other images of its batch
      (CricaVPR's and SuperVLAD's cross-image encoders); evaluation then warns and records it.
    """

    out_dim: int
    #: reads the ViT class token ``features.cls``
    needs_cls: ClassVar[bool] = False
    #: reads ``features.tokens`` (aggregation tokens inserted by the backbone)
    needs_tokens: ClassVar[bool] = False
    #: reads ``features.cls_attention`` (the last block's class-to-patch attention)
    needs_cls_attention: ClassVar[bool] = False
    #: the fewest backbone levels it fuses (2 for multi-level heads such as AFA/IDA)
    min_levels: ClassVar[int] = 1
    data_init: ClassVar[DataInit] = "none"

    #: the constructor arguments that fix the last map's ``(H, W)`` (MixVPR: ``("in_h", "in_w")``), if any
    map_size_args: ClassVar[tuple[str, str] | None] = None

    @property
    def required_map_size(self) -> tuple[int, int] | None:
        """The ``(H, W)`` the last map must have (``None``: any size): the values of :attr:`map_size_args`."""
        if self.map_size_args is None:
            return None
        height, width = (int(getattr(self, name)) for name in self.map_size_args)
        return height, width

    @property
    def required_tokens(self) -> int | None:
        """``T`` of the ``features.tokens: [B, T, C]`` it reads (heads that declare :attr:`needs_tokens`)."""
        return None

    @property
    def min_positions(self) -> int:
        """The fewest local features ``n = H*W`` of the last map the head accepts."""
        return 1

    @property
    def batch_dependent(self) -> bool:
        """Whether a descriptor depends on which images share its batch (then batch size and order
        are part of the protocol: evaluation keeps the file order and records the batch size)."""
        return False

    def no_weight_decay(self) -> set[str]:
        """Names (or globs) of parameters, relative to the head, to train with ``weight_decay=0``."""
        return set()

    def lr_multipliers(self) -> dict[str, float]:
        """Names (or globs) of parameters, relative to the head -> factor of the base learning rate."""
        return {}

    @classmethod
    def in_channels_from(cls, feature_info: Sequence[FeatureLevel]) -> int | tuple[int, ...]:
        """What to pass as ``in_channels`` for a backbone with this ``feature_info``: by default
        the channels of the last (coarsest) level."""
        return feature_info[-1]["num_chs"]

    def forward(self, features: Features) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError
