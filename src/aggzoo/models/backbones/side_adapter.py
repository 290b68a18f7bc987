"""SelaVPR++'s memory-efficient side path: MultiConvAdapters beside a frozen ViT, not inside its blocks.

F. Lu, T. Jin, X. Lan, L. Zhang, Y. Liu, Y. Wang, C. Yuan, "SelaVPR++: Towards Seamless Adaptation of
Foundation Models for Efficient Place Recognition", T-PAMI 2025, arXiv:2502.16601. Original code:
Lu-Feng/SelaVPRplusplus ``model/vision_transformer.py`` (``DinoVisionTransformer.forward_features``),
``model/adapter.py`` (``MulConvAdapter``) and ``train.py`` (freezing, initialisation) (MIT); re-implemented
from them, no code taken.

The ViT runs unchanged (frozen, so nothing is back-propagated through it). A side path ``y`` starts from
the input of block ``s`` and follows the blocks from there:

    y <- x_s                                  (s = 0: the embedded tokens; ViT-L: s = 8, the block-7 output)
    y <- y + A_j(y + x_{s+j+1})               j = 0 .. depth - s - 1, x_{i+1} = block_i(x_i)
    features = norm(y)                        (the ViT's own final norm)

``A_j`` are CricaVPR's multi-scale convolution adapters (:class:`MultiConvAdapter`, same widths and
initialisation: ``D_fc2 = 0`` so that ``y`` starts as ``x_s``, convolutions 1e-5). ViT-B: ``s = 0``, 12
adapters; ViT-L: ``s = 8``, 16 adapters. With ``hashing=True`` a second, independent side path
(``adapters_hashing``, the same structure) gives the features of the hashing branch
(:meth:`SideAdapterViT.forward_hashing`).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from aggzoo.models.backbones.block_adapters import AdaptedViT
from aggzoo.models.backbones.multiconv_adapter import MultiConvAdapter
from aggzoo.models.features import Features

__all__ = ["SideAdapterViT"]


class SideAdapterViT(AdaptedViT):
    """A frozen timm ViT with SelaVPR++'s side path(s) of :class:`MultiConvAdapter` (see the module docstring).

    Args:
        model_name: a timm ViT (SelaVPR++: ``vit_base_patch14_dinov2``, ``vit_large_patch14_dinov2``).
        start_block: ``s``, the block whose input starts the side path (ViT-B 0, ViT-L 8); one adapter
            follows each block from there.
        hashing: add the hashing branch's own side path (``adapters_hashing``).
        pretrained: load the ViT's pretrained weights.
        frozen_stages: ``None`` (upstream): the whole ViT frozen, final norm included; see :class:`AdaptedViT`.
        **model_kwargs: passed to ``timm.create_model``.

    Shapes: ``x: [B, 3, H, W] -> Features(maps=([B, C, H/p, W/p],), cls=[B, C])`` (the float branch);
    :meth:`forward_hashing` the same for the hashing branch. Adapters are ``adapters.{j}`` and
    ``adapters_hashing.{j}`` (upstream ``backbone.adapters.{j}``, ``backbone.adapters_hashing.{j}``).
    """

    def __init__(self, model_name: str, *, start_block: int = 0, hashing: bool = False, pretrained: bool = False,
                 frozen_stages: int | None = None, **model_kwargs: Any) -> None:
        super().__init__(model_name, pretrained=pretrained, frozen_stages=frozen_stages, **model_kwargs)
        depth = len(self.model.blocks)
        if not 0 <= start_block < depth:
            raise ValueError(f"start_block must be in [0, {depth}) for a {depth}-block ViT, got {start_block}")
        self.start_block = start_block
        count = depth - start_block
        self.adapters = nn.ModuleList(MultiConvAdapter(self.out_channels) for _ in range(count))
        self.adapters_hashing = (nn.ModuleList(MultiConvAdapter(self.out_channels) for _ in range(count))
                                 if hashing else None)

    def side_paths(self, x: Tensor, paths: tuple[nn.ModuleList, ...]) -> list[Features]:
        """One pass of the frozen ViT on ``x: [B, 3, H, W]`` with each adapter list of ``paths`` as its own
        side path: one :class:`Features` per path, in order."""
        image_size = (x.shape[-2], x.shape[-1])
        grid = tuple(self.model.patch_embed.dynamic_feat_size(image_size))
        num_prefix = self.model.num_prefix_tokens
        tokens = self.embed_tokens(x)
        rope = self.rotary_embedding(image_size)
        sides: list[Tensor] = []
        for index, block in enumerate(self.model.blocks):
            if index == self.start_block:
                sides = [tokens] * len(paths)
            tokens = self.run_block(block, tokens, rope)
            if index >= self.start_block:
                j = index - self.start_block
                sides = [y + adapters[j](y + tokens, grid, num_prefix) for y, adapters in zip(sides, paths)]
        out = []
        for y in sides:
            normed = self.model.norm(y)
            out.append(Features(maps=(self.patch_map(normed, image_size),), cls=normed[:, 0]))
        return out

    def forward(self, x: Tensor) -> Features:
        return self.side_paths(x, (self.adapters,))[0]

    def forward_hashing(self, x: Tensor) -> Features:
        """The hashing branch's features (its own side path, ``adapters_hashing``)."""
        return self.side_paths(x, (self._hashing_adapters(),))[0]

    def forward_branches(self, x: Tensor) -> tuple[Features, Features]:
        """``(float branch, hashing branch)`` features from one pass of the ViT (upstream's two-branch forward)."""
        float_features, hashing_features = self.side_paths(x, (self.adapters, self._hashing_adapters()))
        return float_features, hashing_features

    def init_hashing_from_float(self) -> None:
        """Copy the float branch's adapters into the hashing branch's (upstream ``train_rerank.py`` starts the
        hashing branch from a trained float model this way)."""
        self._hashing_adapters().load_state_dict(self.adapters.state_dict())

    def _hashing_adapters(self) -> nn.ModuleList:
        if self.adapters_hashing is None:
            raise ValueError("this SideAdapterViT has no hashing branch: build it with hashing=True "
                             "(the two-branch SelaVPR++ model, e.g. selavprpp_dinov2_vitl14.official_rerank)")
        return self.adapters_hashing
