"""SALAD: Sinkhorn Algorithm for Locally Aggregated Descriptors.

S. Izquierdo, J. Civera, "Optimal Transport Aggregation for Visual Place Recognition", CVPR 2024,
arXiv:2311.15937. Original code: serizba/salad ``models/aggregators/salad.py`` (GPL-3.0); followed
for defaults, module structure and state_dict names only, no code taken from it.

Inputs: the patch map ``f: [B, C, H, W]`` (``n = H*W`` local features) and the CLS token
``t: [B, C]``. With ``m`` clusters of dimension ``l`` and a global token of dimension ``g``:

- global token ``g(t) = MLP(C -> 512 -> g)(t)``,
- local features ``f_i -> MLP(C -> 512 -> l)`` (1x1 convs, dropout after the first),
- scores ``S = MLP(C -> 512 -> m): [B, m, n]``,
- assignment ``P``: entropic OT of the features to the clusters plus a learnable dustbin
  (:func:`aggzoo.layers.sinkhorn.log_optimal_transport`, 3 iterations, fp32), dustbin row dropped,
  scaled so that each feature's mass (clusters + dustbin) is 1,
- ``V = f P^T: [B, l, m]``, L2 over ``l`` per cluster, flattened l-major (``V[l, m]`` at ``l*m_total + m``),
- ``desc = L2(cat(L2(g(t)), V))``: ``[B, g + m*l]`` (8448 at the paper's m=64, l=128, g=256).

SALAD-544 is the same head with m=16, l=32, g=32 (``conf/head/salad544.yaml``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aggzoo.layers.sinkhorn import check_more_features_than_clusters, log_optimal_transport
from aggzoo.models.features import Features
from aggzoo.models.heads.base import Head

__all__ = ["HIDDEN_DIM", "SALAD", "local_mlp", "salad_descriptor", "token_mlp"]

#: Hidden width of SALAD's three MLPs (fixed in the paper and in MegaLoc).
HIDDEN_DIM = 512


def token_mlp(in_channels: int, token_dim: int) -> nn.Sequential:
    """``C_in -> 512 -> token_dim`` linear layers with a ReLU between: the global (CLS) token's MLP of SALAD and of
    the heads built on it (SAGE, FoL). Keys ``.0`` and ``.2`` as upstream's ``token_features``."""
    return nn.Sequential(nn.Linear(in_channels, HIDDEN_DIM), nn.ReLU(), nn.Linear(HIDDEN_DIM, token_dim))


def local_mlp(in_channels: int, out_channels: int, dropout: float) -> nn.Sequential:
    """``C_in -> 512 -> C_out`` as 1x1 convolutions, dropout and ReLU after the first (SALAD, SAGE)."""
    # Index layout matches upstream keys: .0 conv, .1 dropout, .2 relu, .3 conv.
    return nn.Sequential(
        nn.Conv2d(in_channels, HIDDEN_DIM, kernel_size=1),
        nn.Dropout(dropout) if dropout > 0 else nn.Identity(),
        nn.ReLU(),
        nn.Conv2d(HIDDEN_DIM, out_channels, kernel_size=1),
    )


def salad_descriptor(global_token: Tensor, local_features: Tensor, assignment: Tensor) -> Tensor:
    """Aggregate and concatenate, without any ``[B, l, m, n]`` intermediate.

    Args:
        global_token: ``g: [B, g]``.
        local_features: ``f: [B, l, n]``.
        assignment: ``P: [B, m, n]`` (any float dtype; cast to the features' dtype).

    Returns ``L2(cat(L2(g), flatten_l_major(L2_l(f P^T)))): [B, g + l*m]``.
    """
    clusters = torch.einsum("bln,bmn->blm", local_features, assignment.to(local_features.dtype))
    clusters = F.normalize(clusters, dim=1).flatten(1)  # l-major: [l0 m0..m_M, l1 m0..m_M, ...]
    return F.normalize(torch.cat([F.normalize(global_token, dim=-1), clusters], dim=-1), dim=-1)


class SALAD(Head):
    """SALAD head.

    Args:
        in_channels: ``C`` of the patch map and the CLS token (768 for DINOv2 ViT-B/14).
        num_clusters: ``m`` (paper 64; SALAD-544: 16). Needs ``n = H*W > m``.
        cluster_dim: ``l``, the reduced dimension of each local feature (paper 128).
        token_dim: ``g``, the dimension of the global scene token (paper 256).
        dropout: dropout after the first layer of the local-feature and score MLPs (paper 0.3).

    Shapes: ``Features(maps=(..., [B, C, H, W]), cls=[B, C]) -> [B, g + m*l]``, ``H*W > m``.
    State-dict names equal upstream's (``token_features.{0,2}``, ``cluster_features.{0,3}``,
    ``score.{0,3}``, ``dust_bin``).
    """

    needs_cls = True

    #: Sinkhorn iterations and entropic regularisation (fixed in the paper).
    num_iters: int = 3
    reg: float = 1.0

    def __init__(
        self,
        in_channels: int,
        *,
        num_clusters: int = 64,
        cluster_dim: int = 128,
        token_dim: int = 256,
        dropout: float = 0.3,
    ) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.num_clusters = num_clusters
        self.cluster_dim = cluster_dim
        self.token_dim = token_dim
        self.out_dim = num_clusters * cluster_dim + token_dim
        self.token_features = token_mlp(in_channels, token_dim)
        self.cluster_features = local_mlp(in_channels, cluster_dim, dropout)
        self.score = local_mlp(in_channels, num_clusters, dropout)
        self.dust_bin = nn.Parameter(torch.tensor(1.0))

    @property
    def min_positions(self) -> int:
        """Optimal transport with a dustbin needs more local features than clusters (``n > m``)."""
        return self.num_clusters + 1

    def assignment(self, scores: Tensor, grid_size: tuple[int, int]) -> Tensor:
        """``S: [B, m, n]`` -> feature-to-cluster mass ``P: [B, m, n]`` in fp32 (dustbin dropped).

        ``grid_size = (H, W)`` is unused here; variants with a spatial term (A^2GC) need it.
        """
        log_plan = log_optimal_transport(scores, self.dust_bin, num_iters=self.num_iters, reg=self.reg)
        return log_plan[:, :-1].exp()

    def forward(self, features: Features) -> Tensor:
        if features.cls is None:
            raise ValueError(
                f"{type(self).__name__} needs a ViT backbone with a CLS token (features.cls is None): "
                "use a ViT backbone rather than a CNN: backbone=dinov2_vitb14 on the train.py / eval.py command line "
                "(TimmBackbone('vit_base_patch14_dinov2') in Python)."
            )
        x = features.last
        height, width = x.shape[-2:]
        check_more_features_than_clusters(height * width, self.num_clusters)
        local = self.cluster_features(x).flatten(2)  # [B, l, n]
        scores = self.score(x).flatten(2)  # [B, m, n]
        plan = self.assignment(scores, (height, width))
        return salad_descriptor(self.token_features(features.cls), local, plan)
