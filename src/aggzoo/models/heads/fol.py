"""FoL: SALAD aggregation guided by the class token's attention, and the reliable regions' local features.

C. Wang, S. Chen, Y. Song, R. Xu, Z. Zhang, J. Zhang, H. Yang, Y. Zhang, K. Fu, S. Du et al., "Focus on
Local: Finding Reliable Discriminative Regions for Visual Place Recognition" (FoL), AAAI 2025,
arXiv:2504.09881. Original code: chenshunpeng/FoL ``aggregators/FoL.py``, ``network_FoL.py`` (Apache-2.0);
read for the computation, defaults and state-dict names only, no code taken.

On the final-norm patch map ``x: [B, C, h, w]`` (``n = h*w``), the class token ``t: [B, C]`` and the last
block's class-to-patch attention ``a: [B, n]`` (:class:`~aggzoo.models.backbones.class_attention.ClassAttentionViT`):

- guidance ``G = a`` where ``a >= 0.01``, else 0;
- assignment ``P``: SALAD's optimal transport of the ``n`` features to ``m`` clusters, whose dustbin row is
  ``1 - G`` per feature instead of one learned score (:func:`aggzoo.layers.sinkhorn.log_optimal_transport`,
  3 iterations), dustbin row dropped;
- global descriptor (``forward``): SALAD's ``L2(cat(L2(MLP(t)), L2_l(f P^T)))``: ``[B, g + m*l]`` (8448);
- region weights: the confidence ``softmax(flat(mean_m P))`` (training adds the importance
  ``softmax(flat(a))``), ``flat`` replacing each row's 3 largest values by its ``int(0.05 n)``-th largest
  (so that no single patch dominates the softmax); the ``225`` patches of largest weight are the
  reliable regions;
- local features (:meth:`FoL.local_features`): SelaVPR's two stride-2 transposed convolutions
  (``C -> 256 -> 128``) give ``[B, 4h-3, 4w-3, 128]``; the locations whose nearest patch is a reliable
  region are kept in row-major order, L2-normalised and zero-padded to a fixed length ``L``
  (:attr:`FoL.local_capacity`, 3600 at 322 and 504 px as upstream). Re-ranking counts their mutual nearest
  neighbours above cosine 0.7 (:mod:`aggzoo.evaluation.local_rerank`, ``evaluation.rerank.method=fol``).

Differences from upstream (none at the released sizes): ``num_selected`` is capped at ``n`` for tiny maps;
``L`` is the most locations the selected patches can cover (upstream: 3600 / 3500 / 1000 / ``H*H`` by the
map height, which a batch can exceed below 322 px).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from aggzoo.layers.sinkhorn import check_more_features_than_clusters, log_optimal_transport
from aggzoo.models.features import Features
from aggzoo.models.heads.base import Head
from aggzoo.models.heads.salad import local_mlp, salad_descriptor, token_mlp
from aggzoo.models.heads.selavpr import LocalAdapt

__all__ = ["FoL", "FoLOutputs", "flatten_peaks"]

#: attention below this is no guidance (``network_FoL.py``: ``mask1 >= 0.01``)
GUIDANCE_FLOOR = 0.01
#: how many of a row's largest values :func:`flatten_peaks` replaces, and by which rank (fraction of ``n``)
PEAKS, PEAK_RANK = 3, 0.05


def flatten_peaks(scores: Tensor) -> Tensor:
    """``[B, n] -> [B, n]``: each row's ``PEAKS`` largest values replaced by its ``int(PEAK_RANK * n)``-th
    largest (0-based, descending), before a softmax (upstream ``replace_top_values``, out of place here)."""
    n = scores.shape[1]
    top = scores.topk(min(PEAKS, n), dim=1).indices
    kth = scores.sort(dim=1, descending=True).values[:, int(PEAK_RANK * n)]
    return scores.scatter(1, top, kth.unsqueeze(1).expand_as(top))


@dataclass(frozen=True)
class FoLOutputs:
    """What FoL's training losses read (:meth:`FoL.outputs`); shapes for ``n = h*w`` patches.

    Attributes:
        descriptor: ``[B, g + m*l]`` global descriptors.
        local: ``[B, L, l]`` the reliable regions' local features (unit, zero-padded).
        dense_local: ``[B, H', W', l]`` every location's local feature (unit).
        region_weights: ``[B, n]`` confidence (+ importance in training): what the regions are chosen by.
        confidence, importance: ``[B, n]`` the two softmax distributions (importance from the attention).
        assignment: ``[B, m, n]`` the transport plan ``P`` (dustbin dropped).
        guidance: ``[B, n]`` the thresholded attention ``G``.
        patches: ``[B, C, n]`` the patch features, L2-normalised per location.
        grid: ``(h, w)`` of the patch map.
    """

    descriptor: Tensor
    local: Tensor
    dense_local: Tensor
    region_weights: Tensor
    confidence: Tensor
    importance: Tensor
    assignment: Tensor
    guidance: Tensor
    patches: Tensor
    grid: tuple[int, int]


class FoL(Head):
    """FoL head: the global descriptor from :meth:`forward`, the reliable regions' local features from
    :meth:`local_features`.

    Args:
        in_channels: ``C`` of the patch map and the class token (768 ViT-B/14, 1024 ViT-L/14).
        num_clusters: ``m`` (64). Needs ``n > m``.
        cluster_dim: ``l`` (128).
        token_dim: ``g`` (256).
        dropout: after the first layer of the local-feature and score MLPs (0.3).
        num_selected: reliable patches kept for the local features (225).
        local_dim: the local feature size (128; 256 channels in between, as SelaVPR).
        train_local: let the local branch train: only FoL's own losses reach it
            (:mod:`aggzoo.training.fol_losses`, ``experiment=fol_dinov2``); frozen otherwise, as SelaVPR's.

    Shapes: ``Features(maps=(..., [B, C, h, w]), cls=[B, C], cls_attention=[B, h*w]) -> [B, g + m*l]``;
    :meth:`local_features` -> ``[B, L, local_dim]``. State-dict names: SALAD's (``token_features.{0,2}``,
    ``cluster_features.{0,3}``, ``score.{0,3}``; no dustbin parameter), ``local_adapt.upconv{1,2}``
    (upstream ``upconv``, ``upconv2``).
    """

    needs_cls = True
    needs_cls_attention = True

    def __init__(self, in_channels: int, *, num_clusters: int = 64, cluster_dim: int = 128, token_dim: int = 256,
                 dropout: float = 0.3, num_selected: int = 225, local_dim: int = 128, train_local: bool = False) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.num_clusters, self.cluster_dim, self.token_dim = num_clusters, cluster_dim, token_dim
        self.num_selected, self.local_dim = num_selected, local_dim
        self.out_dim = num_clusters * cluster_dim + token_dim
        self.token_features = token_mlp(in_channels, token_dim)
        self.cluster_features = local_mlp(in_channels, cluster_dim, dropout)
        self.score = local_mlp(in_channels, num_clusters, dropout)
        self.local_adapt = LocalAdapt(in_channels, 256, local_dim)
        self.local_adapt.requires_grad_(train_local)

    @property
    def min_positions(self) -> int:
        return self.num_clusters + 1

    def _inputs(self, features: Features) -> tuple[Tensor, Tensor, Tensor]:
        if features.cls is None or features.cls_attention is None:
            raise ValueError(f"{type(self).__name__} reads the class token and the last block's class attention "
                             "(features.cls_attention), which only ClassAttentionViT gives: use a fol_* model "
                             "(aggzoo.create_model('fol_dinov2_vitb14')) or backbone=fol_dinov2_vitb14")
        x = features.last
        check_more_features_than_clusters(x.shape[-2] * x.shape[-1], self.num_clusters)
        return x, features.cls, features.cls_attention

    def assignment(self, x: Tensor, attention: Tensor) -> tuple[Tensor, Tensor]:
        """``x: [B, C, h, w]``, ``a: [B, n]`` -> (``P: [B, m, n]`` fp32, guidance ``G: [B, n]``)."""
        guidance = torch.where(attention >= GUIDANCE_FLOOR, attention, torch.zeros_like(attention))
        log_plan = log_optimal_transport(self.score(x).flatten(2), 1 - guidance, num_iters=3)
        return log_plan[:, :-1].exp(), guidance

    def forward(self, features: Features) -> Tensor:
        x, cls, attention = self._inputs(features)
        plan, _ = self.assignment(x, attention)
        return salad_descriptor(self.token_features(cls), self.cluster_features(x).flatten(2), plan)

    def local_capacity(self, grid: tuple[int, int]) -> int:
        """``L`` for an ``(h, w)`` patch grid: the most dense locations ``num_selected`` patches can own."""
        out_h, out_w = 4 * grid[0] - 3, 4 * grid[1] - 3
        per_patch = math.ceil(out_h / grid[0]) * math.ceil(out_w / grid[1])
        return min(out_h * out_w, min(self.num_selected, grid[0] * grid[1]) * per_patch)

    def select_local(self, dense: Tensor, region_weights: Tensor, grid: tuple[int, int]) -> Tensor:
        """``dense: [B, H', W', l]`` (any norm), ``region_weights: [B, h*w]`` -> ``[B, L, l]``: the locations
        whose nearest patch is among the ``num_selected`` heaviest, row-major, unit norm, zeros after."""
        batch, out_h, out_w, dim = dense.shape
        chosen = region_weights.topk(min(self.num_selected, region_weights.shape[1]), dim=1).indices
        mask = torch.zeros_like(region_weights).scatter(1, chosen, 1.0).reshape(batch, 1, *grid)
        keep = F.interpolate(mask, size=(out_h, out_w), mode="nearest").reshape(batch, -1) > 0   # [B, H'W']
        capacity = self.local_capacity(grid)
        # Stable sort of "not kept" puts the kept locations first, in row-major order.
        order = (~keep).to(torch.uint8).sort(dim=1, stable=True).indices[:, :capacity]
        rows = torch.gather(dense.reshape(batch, -1, dim), 1, order.unsqueeze(-1).expand(-1, -1, dim))
        return F.normalize(rows, dim=-1) * torch.gather(keep, 1, order).unsqueeze(-1).to(rows.dtype)

    def outputs(self, features: Features) -> FoLOutputs:
        """Everything FoL's losses read, with the region weights of the current mode (training adds the
        importance: upstream's ``test=False``)."""
        x, cls, attention = self._inputs(features)
        plan, guidance = self.assignment(x, attention)
        descriptor = salad_descriptor(self.token_features(cls), self.cluster_features(x).flatten(2), plan)
        confidence = flatten_peaks(plan.mean(dim=1)).softmax(dim=-1)
        importance = flatten_peaks(attention.float()).softmax(dim=-1)
        weights = confidence + importance if self.training else confidence
        dense = self.local_adapt(x).permute(0, 2, 3, 1)
        grid = (x.shape[-2], x.shape[-1])
        return FoLOutputs(descriptor=descriptor, local=self.select_local(dense, weights, grid),
                          dense_local=F.normalize(dense, dim=-1), region_weights=weights, confidence=confidence,
                          importance=importance, assignment=plan, guidance=guidance,
                          patches=F.normalize(x.flatten(2), dim=1), grid=grid)

    def local_features(self, features: Features) -> Tensor:
        """``[B, L, l]``: the reliable regions' local features (unit, zero rows after them), chosen by the
        confidence alone (upstream's test mode)."""
        x, _, attention = self._inputs(features)
        plan, _ = self.assignment(x, attention)
        confidence = flatten_peaks(plan.mean(dim=1)).softmax(dim=-1)
        dense = self.local_adapt(x).permute(0, 2, 3, 1)
        return self.select_local(dense, confidence, (x.shape[-2], x.shape[-1]))
