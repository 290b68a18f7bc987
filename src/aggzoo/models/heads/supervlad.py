"""SuperVLAD: NetVLAD without cluster centres, few clusters plus ghost clusters.

F. Lu, X. Zhang, C. Ye, S. Dong, L. Zhang, X. Lan, C. Yuan, "SuperVLAD: Compact and Robust Image
Descriptors for Visual Place Recognition", NeurIPS 2024. Original code: Lu-Feng/SuperVLAD
``model/supervlad_layer.py``, ``model/network.py`` (MIT); read for the computation, the defaults and
the state-dict names only, no code taken from it.

On the patch map ``x: [B, C, H, W]`` (DINOv2's final-norm patch tokens; the CLS token is unused),
with ``K`` clusters and ``G`` ghost clusters:

- ``x_i <- x_i / ||x_i||`` over channels,
- ``a = softmax_{K+G}(W x)``, ``W: [K+G, C]`` a 1x1 convolution without bias (the only parameter),
- ``V_k = sum_i a_ik x_i``: NetVLAD's aggregation *without* the ``- c_k`` residual, so no centroid
  parameter exists (the paper's point: the descriptor no longer depends on centres that drift with
  the domain),
- the ``G`` ghost rows are dropped (they absorb uninformative features), each ``V_k`` is
  L2-normalised, flattened K-major and L2-normalised: ``D = K*C`` (3072 at K=4 on ViT-B).

Optional cross-image encoder (``cross_image=True``, the paper's headline model): the descriptor
viewed ``[B, K, C]`` goes through :class:`~aggzoo.layers.cross_image.CrossImageEncoder`, whose attention
runs across the images of the batch, then flatten + L2. The descriptor then depends on the batch
(:attr:`SuperVLAD.batch_dependent`).

1-cluster VLAD (the paper's GeM-sized variant): ``K=1, G=2`` and no encoder: ``D = C``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aggzoo.layers.cross_image import CrossImageEncoder
from aggzoo.models.features import Features
from aggzoo.models.heads.base import Head
from aggzoo.models.heads.netvlad import netvlad_alpha

__all__ = ["SuperVLAD", "supervlad_aggregate"]


def supervlad_aggregate(x: Tensor, logits: Tensor, num_ghosts: int) -> Tensor:
    """Centre-free VLAD.

    Args:
        x: L2-normalised local features ``[B, C, N]``.
        logits: assignment scores ``[B, K+G, N]``.
        num_ghosts: ``G``, the trailing rows to drop after aggregation.

    Returns ``V: [B, K, C]`` with ``V_k = L2(sum_i softmax_{K+G}(logits)_ki x_i)``.
    """
    assignment = F.softmax(logits, dim=1)
    vlad = torch.einsum("bkn,bcn->bkc", assignment, x)
    if num_ghosts:
        vlad = vlad[:, :-num_ghosts]
    return F.normalize(vlad, dim=2)


class SuperVLAD(Head):
    """SuperVLAD head.

    Args:
        in_channels: ``C`` of the patch map (768 for DINOv2 ViT-B/14).
        num_clusters: ``K`` (paper 4; the 1-cluster VLAD: 1). ``D = K*C``.
        num_ghosts: ``G`` ghost clusters (paper 1; the 1-cluster VLAD: 2).
        cross_image: add the cross-image encoder over the K cluster descriptors (the paper's
            headline SuperVLAD; makes the descriptor batch-dependent).
        encoder_heads: attention heads of that encoder (paper 16; must divide ``C``).
        encoder_ffn_dim: its feed-forward width (paper 2048).

    Shapes: ``Features(maps=(..., [B, C, H, W])) -> [B, K*C]``, laid out ``[K, C]`` (K-major).
    State-dict names equal upstream's (``conv.weight`` [K+G, C, 1, 1]; ``encoder.layers.{0,1}.*``).

    Before training, :class:`aggzoo.training.callbacks.HeadDataInit` runs k-means with ``K+G``
    centres on L2-normalised local features and calls :meth:`init_from_clusters`
    (``data_init = "kmeans"``), as upstream's ``initialize_supervlad_layer``.
    """

    data_init = "kmeans"

    def __init__(
        self,
        in_channels: int,
        *,
        num_clusters: int = 4,
        num_ghosts: int = 1,
        cross_image: bool = False,
        encoder_heads: int = 16,
        encoder_ffn_dim: int = 2048,
    ) -> None:
        super().__init__()
        if num_clusters < 1 or num_ghosts < 0:
            raise ValueError(f"SuperVLAD needs num_clusters >= 1 and num_ghosts >= 0, got {num_clusters}, {num_ghosts}")
        self.in_channels = in_channels
        self.num_clusters = num_clusters
        self.num_ghosts = num_ghosts
        self.out_dim = num_clusters * in_channels
        self.conv = nn.Conv2d(in_channels, num_clusters + num_ghosts, kernel_size=1, bias=False)
        self.encoder = (CrossImageEncoder(in_channels, num_heads=encoder_heads, ffn_dim=encoder_ffn_dim)
                        if cross_image else None)

    @property
    def batch_dependent(self) -> bool:
        return self.encoder is not None

    @property
    def kmeans_clusters(self) -> int:
        return self.num_clusters + self.num_ghosts

    @torch.no_grad()
    def init_from_clusters(self, centroids: Tensor, descriptors: Tensor) -> None:
        """``W <- alpha * c_hat`` from k-means centres ``[K+G, C]`` of L2-normalised local descriptors
        ``[N, C]`` (alpha as NetVLAD's: :func:`~aggzoo.models.heads.netvlad.netvlad_alpha`)."""
        expected = (self.num_clusters + self.num_ghosts, self.in_channels)
        if tuple(centroids.shape) != expected:
            raise ValueError(f"expected centroids of shape {expected}, got {tuple(centroids.shape)}")
        alpha = netvlad_alpha(descriptors, centroids)
        self.conv.weight.copy_((alpha * F.normalize(centroids.float(), dim=1))[:, :, None, None])

    def cluster_descriptors(self, features: Features) -> Tensor:
        """``[B, K, C]``: the intra-normalised cluster rows, before the encoder and the final L2."""
        x = F.normalize(features.last, dim=1)
        return supervlad_aggregate(x.flatten(2), self.conv(x).flatten(2), self.num_ghosts)

    def forward(self, features: Features) -> Tensor:
        vlad = self.cluster_descriptors(features)
        descriptor = F.normalize(vlad.flatten(1), dim=1)
        if self.encoder is None:
            return descriptor
        # Upstream encodes the final (globally L2-normalised) descriptor viewed [B, K, C]: rows of
        # norm 1/sqrt(K), not the intra-normalised rows.
        encoded = self.encoder(descriptor.view_as(vlad))
        return F.normalize(encoded.flatten(1), dim=1)
