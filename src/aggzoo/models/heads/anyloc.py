"""AnyLoc-VLAD: hard-assignment VLAD over a fixed vocabulary, no training.

N. Keetha, A. Mishra, J. Karhade, K. M. Jatavallabhula, S. Scherer, M. Krishna, S. Garg, "AnyLoc: Towards
Universal Visual Place Recognition", RA-L 2023, arXiv:2308.00688. Followed for the descriptor and the
vocabulary's form: AnyLoc/DINO ``utilities.py`` ``VLAD`` (and AnyLoc/AnyLoc ``utilities.py`` ``VLAD`` with
its defaults ``vlad_mode="hard"``, ``intra_norm=True``, ``norm_descs=True``; BSD-3-Clause). No code taken.

``x: [B, C, H, W]`` -> local features ``x_i`` L2-normalised over C -> each assigned to the centre of
largest cosine similarity ``k(i) = argmax_k <x_i, c_k / |c_k|>`` -> ``V_k = sum_{i: k(i)=k} (x_i - c_k)``
(the raw centre: residuals are taken from ``c_k``, not from its direction) -> intra-L2 per cluster (an
empty cluster stays zero) -> flatten K-major -> L2 -> ``[B, K*C]``.

The vocabulary ``c`` (:attr:`AnyLocVLAD.centroids`, a buffer saved with the weights) is cosine k-means of
L2-normalised local features: the centres are the *means* of their members, not re-normalised
(``fast_pytorch_kmeans.KMeans(mode="cosine")``, which AnyLoc fits with), so ``|c_k| < 1``.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from aggzoo.models.data_init import DataInit
from aggzoo.models.features import Features
from aggzoo.models.heads.base import Head

__all__ = ["AnyLocVLAD", "cosine_kmeans_means", "nearest_centre"]


def nearest_centre(descriptors: Tensor, centroids: Tensor) -> Tensor:
    """``argmax_k`` of the cosine similarity of each row of ``descriptors [..., N, C]`` to ``centroids [K, C]``:
    ``[..., N]`` (ties: the lowest index)."""
    return (F.normalize(descriptors, dim=-1) @ F.normalize(centroids, dim=-1).T).argmax(dim=-1)


def cosine_kmeans_means(descriptors: Tensor, centroids: Tensor) -> Tensor:
    """One update of cosine k-means: the mean of the L2-normalised ``descriptors [N, C]`` nearest (by
    cosine) to each of ``centroids [K, C]``; a centre with no member becomes zero, as
    ``fast_pytorch_kmeans`` leaves it. ``-> [K, C]``, float32."""
    points = F.normalize(descriptors.float(), dim=1)
    members = F.one_hot(nearest_centre(points, centroids.float()), centroids.shape[0]).float()  # [N, K]
    counts = members.sum(dim=0).unsqueeze(1)  # [K, 1]
    return (members.T @ points) / counts.clamp_min(1.0)


class AnyLocVLAD(Head):
    """AnyLoc's VLAD head (hard assignment, cosine, intra-normalisation).

    Args:
        in_channels: ``C`` of the last map (AnyLoc: 1536, the value facet of DINOv2 ViT-G/14's block 31).
        num_clusters: ``K``, the vocabulary size (AnyLoc: 32); ``D = K * C`` (49152 on ViT-G/14).

    Shapes: ``Features(maps=(..., [B, C, H, W])) -> [B, K * C]``, laid out ``[K, C]`` (K-major).

    Training-free: the vocabulary is fitted from images by ``aggzoo vocabulary`` or, as a k-means
    data-initialisation (``data_init = "kmeans"``), by the training pipeline's ``HeadDataInit``; either
    way :meth:`init_from_clusters` turns the k-means centres into the authors' form. Released
    vocabularies load with the weights (``anyloc_dinov2_vitg14.<domain>``).
    """

    data_init: ClassVar[DataInit] = "kmeans"

    def __init__(self, in_channels: int, *, num_clusters: int = 32) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.num_clusters = num_clusters
        self.out_dim = num_clusters * in_channels
        # Distinct directions until a vocabulary is loaded or fitted (any values describe a valid VLAD).
        self.register_buffer("centroids", F.normalize(torch.randn(num_clusters, in_channels), dim=1))

    @property
    def kmeans_clusters(self) -> int:
        return self.num_clusters

    @torch.no_grad()
    def init_from_clusters(self, centroids: Tensor, descriptors: Tensor) -> None:
        """Set the vocabulary from k-means ``centroids [K, C]`` of the local ``descriptors [N, C]``: one
        cosine k-means update (:func:`cosine_kmeans_means`), so the centres are the members' means, as
        AnyLoc's are, whichever k-means (spherical or Euclidean on normalised features) found them."""
        if tuple(centroids.shape) != (self.num_clusters, self.in_channels):
            raise ValueError(f"expected centroids of shape {(self.num_clusters, self.in_channels)}, "
                             f"got {tuple(centroids.shape)}")
        means = cosine_kmeans_means(descriptors.to(self.centroids.device), centroids.to(self.centroids.device))
        self.centroids.copy_(means)

    def assignment(self, features: Features) -> Tensor:
        """The cluster of every local feature of the last map: ``[B, H*W]`` (int64)."""
        return nearest_centre(features.last.flatten(2).transpose(1, 2), self.centroids.to(features.last.dtype))

    def forward(self, features: Features) -> Tensor:
        x = F.normalize(features.last.flatten(2).transpose(1, 2), dim=2)  # [B, N, C]
        centroids = self.centroids.to(x.dtype)
        members = F.one_hot(nearest_centre(x, centroids), self.num_clusters).to(x.dtype)  # [B, N, K]
        # sum_{i in k} (x_i - c_k) = sum_{i in k} x_i - n_k c_k, without a [B, N, K, C] residual tensor.
        vlad = members.transpose(1, 2) @ x - members.sum(dim=1).unsqueeze(-1) * centroids  # [B, K, C]
        vlad = F.normalize(vlad, dim=2)  # intra-normalisation; an empty cluster stays 0
        return F.normalize(vlad.flatten(1), dim=1)
