"""QAA: query-based adaptive aggregation.

J. Xiao et al., "Query-Based Adaptive Aggregation for Multi-Dataset Joint Training Toward Universal
Visual Place Recognition", arXiv:2507.03831. Original code: arplaboratory/QAA (xjh19972/QAA)
``models/aggregators/qaa.py``; the port followed for structure, defaults and state_dict names is
gmberton/VPR-methods-evaluation ``vpr_models/qaa.py`` (MIT); no code taken from either.

Two sets of learned queries, both independent of the image:

- a codebook ``F = LN(Q_f + SA(Q_f)): [Nq, l]`` (``Nq = 256`` queries of dimension ``l = 128``),
- score queries ``Q_s' = LN(Q_s + SA(Q_s)): [Nq, C]``.

The score queries cross-attend to the patches ``x: [B, n, C]``; a LayerNorm and a per-query linear
map ``C -> m`` give the scores ``P = Conv1d(LN(CA(Q_s', x, x))): [B, m, Nq]``. The cluster
descriptors are ``V = F^T P^T: [B, l, m]``, L2 over ``l``, flattened l-major, L2: ``[B, l*m]``
(8192 at m=64, l=128). The image only enters through the scores.

Score normalisation (the authors' ``score_norm`` switch, ``sinkhorn``): the authors' ``qaa.py`` turns
the scores into a transport plan before aggregating, SALAD's optimal transport with a dustbin, here over
the ``Nq`` queries instead of the patches (:func:`aggzoo.layers.sinkhorn.log_optimal_transport`: ``m``
cluster rows plus a learnable dustbin row ``z``, marginals ``[1..1, Nq - m] / (Nq + m)`` and
``1 / (Nq + m)``, 3 log-domain iterations, scaled by ``Nq + m``, dustbin row dropped): ``P`` then holds
how much of each query goes to each cluster, and ``Nq > m`` is needed. The VPR-methods-evaluation port
has no such step (``sinkhorn=False``): the raw scores weight the codebook. Which one a released weight
used is stated in its pretrained cfg (``aggzoo.zoo.qaa``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aggzoo.layers.sinkhorn import log_optimal_transport
from aggzoo.models.features import Features
from aggzoo.models.heads.base import Head

__all__ = ["QAA"]


class _SelfAttendedQueries(nn.Module):
    """``LN(Q + SelfAttention(Q)): [1, Nq, d]``, computed once per forward (no image input)."""

    def __init__(self, dim: int, num_queries: int, num_heads: int) -> None:
        super().__init__()
        self.queries = nn.Parameter(torch.randn(1, num_queries, dim))
        self.self_attn = nn.MultiheadAttention(dim, num_heads=num_heads, batch_first=True)
        self.norm_q = nn.LayerNorm(dim)

    def forward(self) -> Tensor:
        q = self.queries
        return self.norm_q(q + self.self_attn(q, q, q, need_weights=False)[0])


class _QueryScores(nn.Module):
    """Cross-attention of the score queries to the patches -> LayerNorm -> per-query ``C -> m``."""

    def __init__(self, dim: int, num_clusters: int, num_heads: int) -> None:
        super().__init__()
        self.cross_attn = nn.MultiheadAttention(dim, num_heads=num_heads, batch_first=True)
        self.norm_out = nn.LayerNorm(dim)
        self.conv = nn.Conv1d(dim, num_clusters, kernel_size=1)

    def forward(self, patches: Tensor, queries: Tensor) -> Tensor:
        """``patches: [B, n, C]``, ``queries: [1, Nq, C]`` -> scores ``[B, m, Nq]``."""
        queries = queries.expand(patches.shape[0], -1, -1)
        attended = self.norm_out(self.cross_attn(queries, patches, patches, need_weights=False)[0])
        return self.conv(attended.transpose(1, 2))


class QAA(Head):
    """QAA head.

    Args:
        in_channels: ``C`` of the last map (768 for DINOv2 ViT-B/14); divisible by ``score_heads``.
        num_clusters: ``m`` (64).
        cluster_dim: ``l``, the codebook dimension (128); divisible by ``feature_heads``.
        num_queries: ``Nq`` (256).
        feature_heads: attention heads of the codebook self-attention (16).
        score_heads: attention heads of the score queries' self- and cross-attention (16).
        sinkhorn: normalise the scores ``[B, m, Nq]`` by optimal transport with a dustbin (the authors'
            ``qaa.py``, on by default there) or use them as they are (the VPR-methods-evaluation port).
            On, the head holds the dustbin score ``dust_bin`` (init 1) and needs ``Nq > m``.

    Shapes: ``Features(maps=(..., [B, C, H, W])) -> [B, l*m]``. Keys as the port: ``queries_feature.*``,
    ``queries_score.*``, ``score.{cross_attn, norm_out, conv}.*``, and ``dust_bin`` with ``sinkhorn``.
    """

    #: Sinkhorn iterations and entropic regularisation of the score normalisation (the authors' 3 and 1).
    num_iters: int = 3
    reg: float = 1.0

    def __init__(
        self,
        in_channels: int,
        *,
        num_clusters: int = 64,
        cluster_dim: int = 128,
        num_queries: int = 256,
        feature_heads: int = 16,
        score_heads: int = 16,
        sinkhorn: bool = True,
    ) -> None:
        super().__init__()
        for name, dim, heads in (("in_channels", in_channels, score_heads), ("cluster_dim", cluster_dim, feature_heads)):
            if dim % heads:
                raise ValueError(f"QAA: {name}={dim} must be divisible by its number of attention heads ({heads})")
        if sinkhorn and num_queries <= num_clusters:
            raise ValueError(f"QAA with sinkhorn=True transports num_queries={num_queries} queries to "
                             f"num_clusters={num_clusters} clusters plus a dustbin, which needs more queries than "
                             "clusters: raise num_queries or set sinkhorn=False")
        self.in_channels = in_channels
        self.num_clusters = num_clusters
        self.sinkhorn = sinkhorn
        self.cluster_dim = cluster_dim
        self.out_dim = num_clusters * cluster_dim
        self.queries_feature = _SelfAttendedQueries(cluster_dim, num_queries, feature_heads)
        self.queries_score = _SelfAttendedQueries(in_channels, num_queries, score_heads)
        self.score = _QueryScores(in_channels, num_clusters, score_heads)
        if sinkhorn:
            self.dust_bin = nn.Parameter(torch.tensor(1.0))

    def assignment(self, scores: Tensor) -> Tensor:
        """Scores ``[B, m, Nq]`` -> the weights of the codebook rows per cluster ``[B, m, Nq]``: the transport
        plan without the dustbin row (fp32) with ``sinkhorn``, else the scores themselves."""
        if not self.sinkhorn:
            return scores
        log_plan = log_optimal_transport(scores, self.dust_bin, num_iters=self.num_iters, reg=self.reg)
        return log_plan[:, :-1].exp()

    def forward(self, features: Features) -> Tensor:
        patches = features.last.flatten(2).transpose(1, 2)  # [B, n, C]
        codebook = self.queries_feature()[0]  # [Nq, l]
        scores = self.assignment(self.score(patches, self.queries_score()))  # [B, m, Nq]
        clusters = torch.einsum("ql,bmq->blm", codebook.to(scores.dtype), scores)
        clusters = F.normalize(clusters, dim=1).flatten(1)  # l-major
        return F.normalize(clusters, dim=-1)
