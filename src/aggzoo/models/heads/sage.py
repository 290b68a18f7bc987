"""SAGE: soft probing (residual patch weighting) before bilinear aggregation, with an optional cross-image encoder.

S. Chen, C. Wang, R. Xu, X. Pei, Y. Song, J. Lin, W. Xu, J. Zhang, L. Guo, S. Xu, "SAGE: Spatial-visual
Adaptive Graph Exploration for Efficient Visual Place Recognition", ICLR 2026, arXiv:2509.25723.
Original code: chenshunpeng/SAGE ``aggregators/SAGE.py`` (``SoftP``, ``SoftWeighting``, ``DPN``) and
``network.py`` (MIT), read for the computation, the configuration and the state-dict names only.

On the final-norm patch map ``x: [B, C, H, W]`` (``n = H*W``) and CLS token ``t: [B, C]``, with ``m``
clusters of dimension ``l`` and a ``g``-dimensional scene token (upstream's ``network.py`` configuration:
``bilinear=True, remove_mean=True, constant_norm='softmax', post_norm='dpn', with_token=True,
final_norm=True``):

- soft weighting: ``x_i <- (1 + alpha * sigmoid(MLP(||x_i|| + eps))) x_i`` (``MLP: 1 -> 128 -> 1``,
  ``alpha = 0.5``, ``eps = 1e-6``), a residual weight from each patch's L2 response;
- local features ``f = MLP(C -> 512 -> l)(x): [B, l, n]`` and scores ``S = MLP(C -> 512 -> m)(x): [B, m, n]``
  (SALAD's 1x1-convolution MLPs, dropout after the first layer);
- ``f <- f - mean(f)``: one scalar per image, the mean over all ``l x n`` entries (upstream calls
  ``adaptive_avg_pool2d`` on the 3-D ``[B, l, n]`` tensor, which averages its last two axes). Upstream
  centres ``S`` the same way; the softmax over positions ignores that constant, so it is not computed here;
- ``A = softmax_n(S)`` (each cluster's weights over the positions sum to 1), ``V = f A^T: [B, l, m]``;
- ``V <- L2_l(DPN(V / n))``: :class:`~aggzoo.layers.power_norm.DynamicPowerNorm` over the ``m`` columns
  (exponent predictor ``m -> m/2 -> 1``), then each cluster column L2-normalised over ``l``;
- ``desc = L2(cat(L2(MLP(C -> 512 -> g)(t)), flatten_l_major(V)))``: ``[B, g + m*l]`` (8448).

Cross-image encoder (``cross_image=True``, the authors' "performance edition"): the descriptor viewed
``[B, D / 768, 768]`` (11 chunks of 768 whatever the backbone width) goes through
:class:`~aggzoo.layers.cross_image.CrossImageEncoder` (2 layers, 16 heads, feed-forward 1024), whose
attention runs across the images of the batch, and is flattened back: the descriptor then depends on
the batch (:attr:`SAGE.batch_dependent`). Upstream returns the encoder output as it is, not unit-norm,
and searches it by L2 distance (``test.py``: ``faiss.IndexFlatL2``); ``l2_after_encoder=True`` adds a
final L2 for training and inner-product search in aggzoo, which assume unit-norm descriptors.

Upstream's ``SoftP`` also builds a ``single_branch`` MLP (the ``bilinear=False`` variant): the released
files hold it, the forward never reads it, and it is not built here (the converter drops it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aggzoo.layers.cross_image import CrossImageEncoder
from aggzoo.layers.power_norm import DynamicPowerNorm
from aggzoo.models.features import Features
from aggzoo.models.heads.base import Head
from aggzoo.models.heads.salad import local_mlp, token_mlp

__all__ = ["SAGE", "SoftWeighting", "bilinear_clusters"]


class SoftWeighting(nn.Module):
    """Soft probing's residual weighting, ``x: [B, C, H, W] -> [B, C, H, W]``:
    ``x_i (1 + alpha * sigmoid(MLP(||x_i||_2 + eps)))``, ``MLP: 1 -> hidden -> 1`` (ReLU)."""

    def __init__(self, hidden_dim: int = 128, alpha: float = 0.5, eps: float = 1e-6) -> None:
        super().__init__()
        self.alpha = alpha
        self.eps = eps
        # Index layout as upstream's keys: .0 linear, .1 relu, .2 linear, .3 sigmoid.
        self.predictor = nn.Sequential(nn.Linear(1, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, 1), nn.Sigmoid())

    def weights(self, x: Tensor) -> Tensor:
        """``beta: [B, 1, H, W]`` in ``(0, alpha)``, the extra weight of each position."""
        response = x.norm(dim=1, keepdim=True) + self.eps
        return self.alpha * self.predictor(response.movedim(1, -1)).movedim(-1, 1)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.weights(x) * x


def bilinear_clusters(local_features: Tensor, scores: Tensor) -> Tensor:
    """``V = (f - mean(f)) softmax_n(S)^T``.

    Args:
        local_features: ``f: [B, l, n]``.
        scores: ``S: [B, m, n]``.

    Returns ``V: [B, l, m]``, ``mean(f)`` being one scalar per image (over ``l`` and ``n``).
    """
    centred = local_features - local_features.mean(dim=(1, 2), keepdim=True)
    return torch.einsum("bln,bmn->blm", centred, F.softmax(scores, dim=2).to(centred.dtype))


class SAGE(Head):
    """SAGE's soft-probing aggregator (upstream ``SoftP``), optionally followed by its cross-image encoder.

    Args:
        in_channels: ``C`` of the patch map and the CLS token (1024 for DINOv2 ViT-L/14, 768 for ViT-B/14).
        num_clusters: ``m`` (64).
        cluster_dim: ``l`` (128).
        token_dim: ``g``, the scene token's dimension (256).
        dropout: dropout after the first layer of the local-feature and score MLPs (0.3).
        weighting_hidden_dim: hidden width of the soft weighting's predictor (128).
        weighting_alpha: ``alpha``, the largest extra weight of a patch (0.5).
        cross_image: add the cross-image encoder (the authors' best model; makes the head batch-dependent).
        encoder_dim: width of the encoder's tokens, the descriptor cut into ``D / encoder_dim`` chunks (768).
        encoder_heads: the encoder's attention heads (16).
        encoder_ffn_dim: its feed-forward width (1024).
        l2_after_encoder: L2-normalise the encoder's output (upstream does not; see the module docstring).

    Shapes: ``Features(maps=(..., [B, C, H, W]), cls=[B, C]) -> [B, g + m*l]``. State-dict names equal
    upstream's ``aggregator.*`` (``soft_weighting.predictor.{0,2}``, ``token_features.{0,2}``,
    ``cluster_features.{0,3}``, ``score.{0,3}``, ``gpn.projection.{0,3}``) and ``encoder.layers.{0,1}.*``.
    """

    needs_cls = True

    def __init__(
        self,
        in_channels: int,
        *,
        num_clusters: int = 64,
        cluster_dim: int = 128,
        token_dim: int = 256,
        dropout: float = 0.3,
        weighting_hidden_dim: int = 128,
        weighting_alpha: float = 0.5,
        cross_image: bool = False,
        encoder_dim: int = 768,
        encoder_heads: int = 16,
        encoder_ffn_dim: int = 1024,
        l2_after_encoder: bool = False,
    ) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.num_clusters = num_clusters
        self.cluster_dim = cluster_dim
        self.token_dim = token_dim
        self.out_dim = num_clusters * cluster_dim + token_dim
        if cross_image and self.out_dim % encoder_dim:
            raise ValueError(f"SAGE's cross-image encoder cuts the {self.out_dim}-D descriptor into chunks of "
                             f"encoder_dim={encoder_dim}: choose an encoder_dim that divides {self.out_dim}")
        self.l2_after_encoder = l2_after_encoder
        self.soft_weighting = SoftWeighting(weighting_hidden_dim, weighting_alpha)
        self.token_features = token_mlp(in_channels, token_dim)
        self.cluster_features = local_mlp(in_channels, cluster_dim, dropout)
        self.score = local_mlp(in_channels, num_clusters, dropout)
        self.gpn = DynamicPowerNorm(num_clusters, num_clusters // 2)
        self.encoder = (CrossImageEncoder(encoder_dim, num_heads=encoder_heads, ffn_dim=encoder_ffn_dim)
                        if cross_image else None)
        self.encoder_dim = encoder_dim

    @property
    def batch_dependent(self) -> bool:
        return self.encoder is not None

    def cluster_matrix(self, x: Tensor) -> Tensor:
        """``x: [B, C, H, W]`` -> ``V: [B, l, m]``, power-normalised and L2-normalised per cluster column."""
        x = self.soft_weighting(x)
        scores = self.score(x).flatten(2)
        clusters = bilinear_clusters(self.cluster_features(x).flatten(2), scores)
        return F.normalize(self.gpn(clusters / scores.shape[2]), dim=1)

    def descriptor(self, features: Features) -> Tensor:
        """``[B, g + m*l]`` unit-norm: the aggregator's output, before the cross-image encoder."""
        if features.cls is None:
            raise ValueError("SAGE needs a ViT backbone with a CLS token (features.cls is None): use "
                             "backbone=sage_dinov2_vitl14 (or any ViT) rather than a CNN")
        clusters = self.cluster_matrix(features.last).flatten(1)  # l-major: V[l, m] at l*m_total + m
        token = F.normalize(self.token_features(features.cls.to(clusters.dtype)), dim=-1)
        return F.normalize(torch.cat([token, clusters], dim=-1), dim=-1)

    def forward(self, features: Features) -> Tensor:
        descriptor = self.descriptor(features)
        if self.encoder is None:
            return descriptor
        encoded = self.encoder(descriptor.view(descriptor.shape[0], -1, self.encoder_dim)).flatten(1)
        return F.normalize(encoded, dim=-1) if self.l2_after_encoder else encoded
