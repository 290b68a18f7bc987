"""NetVLAD: soft-assignment VLAD pooling trained end to end.

R. Arandjelovic, P. Gronat, A. Torii, T. Pajdla, J. Sivic, "NetVLAD: CNN architecture for weakly
supervised place recognition", CVPR 2016, arXiv:1511.07247. Reference implementation followed for
defaults and state_dict names: gmberton/deep-visual-geo-localization-benchmark
``model/aggregation.py`` (MIT); no code taken from it.

``x: [B, C, H, W]`` -> L2 over C -> soft-assignment ``a = softmax_K(conv1x1(x))`` ->
residuals ``V_k = sum_i a_ik (x_i - c_k)`` -> intra-L2 per cluster -> flatten K-major -> L2 ->
``[B, K*C]``; optionally PCA-whitened to ``whiten_dim`` (the paper's 4096-D NetVLAD, the SFRS release):
``W v + b`` (:class:`~aggzoo.layers.whitening.AffineWhitening`) -> L2 -> ``[B, whiten_dim]``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aggzoo.layers.whitening import AffineWhitening
from aggzoo.models.features import Features
from aggzoo.models.heads.base import Head

__all__ = ["NetVLAD", "netvlad_alpha"]


def netvlad_alpha(descriptors: Tensor, centroids: Tensor) -> float:
    """Softmax sharpness from data: ``-ln(0.01) / mean(top1 - top2)`` of the cosine similarities
    between L2-normalised descriptors ``[N, C]`` and L2-normalised centroids ``[K, C]``.

    With this alpha, a descriptor whose two nearest centroids differ by the mean gap gives the
    second one 1 % of the first one's weight.
    """
    sims = F.normalize(descriptors.float(), dim=1) @ F.normalize(centroids.float(), dim=1).T
    top2 = sims.topk(2, dim=1).values
    gap = (top2[:, 0] - top2[:, 1]).mean().item()
    if gap <= 0:
        raise ValueError("NetVLAD init: every descriptor is equidistant from its two nearest centroids")
    return -math.log(0.01) / gap


class NetVLAD(Head):
    """NetVLAD head.

    Args:
        in_channels: ``C`` of the last map.
        num_clusters: ``K`` (paper and benchmark default 64); ``D = K * C``.
        normalize_input: L2-normalise each local feature over channels first (paper: yes).
        whiten_dim: ``None`` (the VLAD vector itself) or the size of a fixed PCA-whitening applied to the
            L2-normalised VLAD vector and followed by a final L2 (paper section 5: 4096 on VGG16). The
            released weights hold a PCA fitted after training; the layer is an ordinary Linear.

    Shapes: ``Features(maps=(..., [B, C, H, W])) -> [B, K * C]``, laid out ``[K, C]`` (K-major), or
    ``[B, whiten_dim]``.

    Before training, :class:`aggzoo.training.callbacks.HeadDataInit` runs k-means (``K`` centres) on
    local features and calls :meth:`init_from_clusters` (``data_init = "kmeans"``).
    """

    data_init = "kmeans"

    def __init__(self, in_channels: int, *, num_clusters: int = 64, normalize_input: bool = True,
                 whiten_dim: int | None = None) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.num_clusters = num_clusters
        self.normalize_input = normalize_input
        self.conv = nn.Conv2d(in_channels, num_clusters, kernel_size=1, bias=False)
        self.centroids = nn.Parameter(torch.rand(num_clusters, in_channels))
        vlad_dim = num_clusters * in_channels
        self.whiten = None if whiten_dim is None else AffineWhitening(vlad_dim, whiten_dim)
        self.out_dim = vlad_dim if whiten_dim is None else whiten_dim

    @property
    def kmeans_clusters(self) -> int:
        return self.num_clusters

    @torch.no_grad()
    def init_from_clusters(self, centroids: Tensor, descriptors: Tensor) -> None:
        """Data-driven initialisation (NetVLAD paper, section 3.2).

        Args:
            centroids: k-means centres ``[K, C]`` of L2-normalised local descriptors.
            descriptors: the descriptors ``[N, C]`` they were computed from (for alpha).
        """
        if tuple(centroids.shape) != (self.num_clusters, self.in_channels):
            raise ValueError(f"expected centroids of shape {(self.num_clusters, self.in_channels)}, "
                             f"got {tuple(centroids.shape)}")
        alpha = netvlad_alpha(descriptors, centroids)
        c_hat = F.normalize(centroids.float(), dim=1)
        self.conv.weight.copy_((alpha * c_hat)[:, :, None, None])
        self.centroids.copy_(centroids)

    def soft_assignment(self, x: Tensor) -> Tensor:
        """``x: [B, C, H, W]`` (already normalised if configured) -> ``a: [B, K, H*W]``."""
        return F.softmax(self.conv(x).flatten(2), dim=1)

    def forward(self, features: Features) -> Tensor:
        x = features.last
        if self.normalize_input:
            x = F.normalize(x, dim=1)
        a = self.soft_assignment(x)  # [B, K, N]
        flat = x.flatten(2)  # [B, C, N]
        # sum_i a_ik (x_i - c_k) = sum_i a_ik x_i - c_k sum_i a_ik, without a [B, K, C, N] tensor.
        vlad = torch.einsum("bkn,bcn->bkc", a, flat) - a.sum(dim=2).unsqueeze(-1) * self.centroids
        vlad = F.normalize(vlad, dim=2)  # intra-normalisation
        vlad = F.normalize(vlad.flatten(1), dim=1)  # K-major: [k0 c0..cC, k1 c0..cC, ...]
        if self.whiten is None:
            return vlad
        return F.normalize(self.whiten(vlad), dim=1)
