"""GSP: generalized sum pooling by partial optimal transport.

Y. Z. Gurbuz, O. Sener, A. A. Alatan, "Generalized Sum Pooling for Metric Learning", ICCV 2023,
arXiv:2308.09228. Original code: yetigurbuz/generalized-sum-pooling (MIT; TensorFlow
``framework/layers/pooling/generalized_sum_pooling.py`` + ``utilities/optimal_transport_utils.py`` and a
PyTorch port ``pytorch/gsp``); followed for the math and defaults, no code taken from it.

Local features ``z_i = W x_i`` (1x1 conv C -> D, no bias), ``i = 1..n``, each carry mass ``1/n``. A
fraction ``mu`` of the total mass is moved to ``K`` learned prototypes ``q_k`` with entropic cost
``c_ki = ||N(q_k) - N(z_i)||_2`` (kernel ``exp(-gamma c)``), where ``N(x) = x / max(|x|, 1)`` is the
authors' Lipschitz-continuous L2 normalisation (their TF ``L2Normalization`` and the PyTorch port's
``LipschitzL2Normalization``): vectors of norm <= 1 stay as they are, longer ones are projected onto the
unit sphere, so the cost is continuous at the origin; the rest stays as residual mass
``rho_i``. The solution has the closed form ``rho_i = (1/n) / (1 + lambda s_i)`` with
``s_i = sum_k exp(-gamma c_ki)`` and a scalar ``lambda`` set by ``sum_i (1/n - rho_i) = mu``, found by
the authors' fixed-point iteration (run here in the log domain: ``l = log lambda``,
``l <- l + log mu - log mean_i sigmoid(l + log s_i)``, stopped once converged; gradients by implicit
differentiation at the solution, as upstream). The pooling weights are the transported
fractions ``w_i = (1 - n rho_i) / mu = sigmoid(l + log s_i) / mu`` (mean 1), and

    desc = L2( (1/n) sum_i w_i z_i ): [B, D].

``mu = 1`` moves all the mass (``lambda -> inf``, every ``w_i = 1``): exactly average pooling of ``z``.

Prototype initialisation from data, as upstream (``data_init = "pooled"``; run by the ``HeadDataInit``
callback before training): the ``N``-normalised average-pooled embeddings of about a thousand training
images (upstream's 1024-entry memory) seed a greedy k-center selection (:func:`greedy_k_center`) whose
``K`` picks become the prototypes. Upstream fills that memory during its first training steps, while
the layer outputs plain average pooling; here it is filled by one pass before the first step.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aggzoo.models.features import Features
from aggzoo.models.heads.base import Head

__all__ = ["GSP", "greedy_k_center", "lipschitz_divisor", "lipschitz_normalize", "partial_transport_weights"]


#: the fixed-point loop stops once a step moves every ``log lambda`` by less than this
_CONVERGED = 1e-6
#: how many fixed-point steps run between two convergence checks (each check reads one value back)
_CHECK_EVERY = 8


def partial_transport_weights(log_mass: Tensor, transport_ratio: float, num_iters: int) -> Tensor:
    """Pooling weights ``w_i`` of generalized sum pooling.

    Args:
        log_mass: ``log s_i = logsumexp_k(-gamma c_ki)``: ``[B, n]``.
        transport_ratio: ``mu`` in ``(0, 1]``, the fraction of the total mass moved to the prototypes.
        num_iters: at most this many fixed-point steps for ``lambda`` (upstream: always 100). The loop
            stops earlier once converged: the fixed point is unique (the transported mass grows
            strictly with ``lambda``), so stopping there changes nothing but the time.

    Returns ``w: [B, n]`` with ``mean_i w_i = 1`` at convergence; all ones when ``mu = 1``.
    """
    if transport_ratio >= 1.0:
        # The constraint sum_i (1/n - rho_i) = 1 forces rho = 0: the limit lambda -> inf.
        return torch.ones_like(log_mass)
    log_mu = math.log(transport_ratio)
    with torch.no_grad():  # the iterates need no tape: the gradient comes from the implicit step below
        # Start where the best-matched feature is half transported: the mean transported fraction is
        # then at least 1/(2n), so its log stays finite however small exp(-gamma c) gets.
        log_lambda = -log_mass.amax(dim=-1, keepdim=True)
        for step in range(1, num_iters + 1):
            change = log_mu - torch.sigmoid(log_lambda + log_mass).mean(dim=-1, keepdim=True).log()
            log_lambda += change
            if step % _CHECK_EVERY == 0 and change.abs().max() < _CONVERGED:
                break
    # One Newton step on g(l) = mean_i sigmoid(l + log s_i) - mu from the detached solution l*: its
    # value refines l*, and its gradient is the implicit-function gradient dl/ds = -g_s / g_l at the
    # root (what upstream's hand-written backward computes), without a tape through the loop.
    transported = torch.sigmoid(log_lambda + log_mass)
    slope = (transported * (1 - transported)).mean(dim=-1, keepdim=True).detach().clamp_min(1e-12)
    log_lambda = log_lambda - (transported.mean(dim=-1, keepdim=True) - transport_ratio) / slope
    return torch.sigmoid(log_lambda + log_mass) / transport_ratio


def lipschitz_divisor(norm: Tensor) -> Tensor:
    """``s = |x|`` where ``|x| > 1``, else 1: the divisor of GSP's Lipschitz normalisation.

    The authors' rule (``pytorch/gsp/norm_layer.py``: a mask ``|x| > 1``, strict) decides per vector
    whether the norm enters at all, so at ``|x| = 1`` exactly no gradient flows through it.
    ``norm.clamp_min(1)`` gives the same values but lets the gradient through at exactly 1.
    """
    return torch.where(norm > 1.0, norm, torch.ones_like(norm))


def lipschitz_normalize(x: Tensor, dim: int = -1) -> Tensor:
    """``x / s`` along ``dim`` with ``s = |x|`` if ``|x| > 1`` else 1: GSP's Lipschitz-continuous L2
    normalisation.

    Unlike ``F.normalize``, vectors with norm <= 1 are returned unchanged. Autograd of this expression
    is the authors' hand-written gradient: the projection's Jacobian where ``|x| > 1``, the identity
    elsewhere (including ``|x| = 1`` exactly).
    """
    return x / lipschitz_divisor(torch.linalg.vector_norm(x, dim=dim, keepdim=True))


@torch.no_grad()
def greedy_k_center(points: Tensor, k: int, *, seeds: Tensor | None = None) -> Tensor:
    """Greedy k-center (farthest-point) selection of ``k`` rows of ``points [N, D] -> [k, D]``.

    Each pick is the point farthest, in squared Euclidean distance, from everything picked so far and
    from ``seeds [M, D]`` (which are not returned; upstream seeds with the first ``K`` memory entries).
    Without seeds the first pick is ``points[0]``. Ties go to the lowest index.
    """
    points = points.float()
    if k > points.shape[0]:
        raise ValueError(f"greedy k-center cannot pick {k} of {points.shape[0]} points")
    if seeds is not None and seeds.shape[0] > 0:
        nearest = torch.cdist(points, seeds.float()).square().amin(dim=1)  # [N]
    else:
        nearest = torch.full(points.shape[:1], torch.inf, device=points.device)
    picked = []
    for _ in range(k):
        index = int(torch.argmax(nearest))
        picked.append(index)
        nearest = torch.minimum(nearest, (points - points[index]).square().sum(dim=1))
    return points[picked]


class GSP(Head):
    """Generalized sum pooling head.

    Args:
        in_channels: ``C`` of the last map.
        embedding_dim: ``D`` of the 1x1 feature transform; the descriptor size (upstream's
            conventional ResNet-50 setting: 512).
        num_prototypes: ``K`` transport targets (upstream "small" configs: 64; "large": 128).
        transport_ratio: ``mu``, the fraction of mass transported (0.3); 1 gives average pooling.
        entropy_weight: ``gamma`` in ``exp(-gamma c)`` (5.0).
        num_iters: fixed-point iterations (100).

    Shapes: ``Features(maps=(..., [B, C, H, W])) -> [B, D]``.
    """

    #: the HeadDataInit callback calls :meth:`init_from_pooled` with :meth:`pooled_embedding` of
    #: training images before the first step
    data_init = "pooled"

    def __init__(
        self,
        in_channels: int,
        *,
        embedding_dim: int = 512,
        num_prototypes: int = 64,
        transport_ratio: float = 0.3,
        entropy_weight: float = 5.0,
        num_iters: int = 100,
    ) -> None:
        super().__init__()
        if not 0.0 < transport_ratio <= 1.0:
            raise ValueError(f"GSP transport_ratio (mu) must be in (0, 1], got {transport_ratio}")
        self.in_channels = in_channels
        self.out_dim = embedding_dim
        self.transport_ratio = transport_ratio
        self.entropy_weight = entropy_weight
        self.num_iters = num_iters
        self.feature_transform = nn.Conv2d(in_channels, embedding_dim, kernel_size=1, bias=False)
        self.prototypes = nn.Parameter(nn.init.xavier_uniform_(torch.empty(num_prototypes, embedding_dim)))

    def pooling_weights(self, embedded: Tensor) -> Tensor:
        """``z: [B, D, n]`` -> ``w: [B, n]`` in fp32 (transported fraction of each feature / mu)."""
        with torch.autocast(device_type=embedded.device.type, enabled=False):
            feats = embedded.float()  # [B, D, n]
            protos = lipschitz_normalize(self.prototypes.float())  # [K, D]
            # Euclidean distance of N(q) and N(z) = z / s, s = |z| where |z| > 1 else 1 (lipschitz_divisor):
            # |N(q)|^2 + |z|^2 / s^2 - 2 q.z / s, with q.z from one matrix product scaled per column
            # afterwards ([B, K, n]), so that no normalised copy of the [B, D, n] features is made
            # (torch.cdist also goes through a matrix product at these sizes). The floor keeps the
            # square root's gradient finite where a feature meets a prototype.
            norms = torch.linalg.vector_norm(feats, dim=1, keepdim=True)  # [B, 1, n]
            scale = lipschitz_divisor(norms)
            cross = torch.matmul(protos, feats) / scale  # [B, K, n]
            proto_sq = protos.square().sum(dim=-1, keepdim=True)  # [K, 1]
            cost = (proto_sq + (norms / scale).square() - 2 * cross).clamp_min(1e-12).sqrt()
            log_mass = torch.logsumexp(-self.entropy_weight * cost, dim=1)  # [B, n]
            return partial_transport_weights(log_mass, self.transport_ratio, self.num_iters)

    def pooled_embedding(self, features: Features) -> Tensor:
        """``[B, D]``: the ``N``-normalised average of the embedded features (upstream's memory entries)."""
        return lipschitz_normalize(self.feature_transform(features.last).mean(dim=(-2, -1)).float())

    @torch.no_grad()
    def init_from_pooled(self, embeddings: Tensor) -> None:
        """Prototypes from ``embeddings [N, D]`` (:meth:`pooled_embedding` of N training images).

        The first ``K`` embeddings seed a greedy k-center selection among the others, as upstream;
        with fewer than ``2K`` images every embedding is a candidate and nothing seeds.
        """
        k = self.prototypes.shape[0]
        if embeddings.shape[0] < k:
            raise ValueError(f"GSP's prototype initialisation needs at least {k} images (num_prototypes), got "
                             f"{embeddings.shape[0]}: sample more (callbacks.head_data_init.pooled_images) or "
                             "use a larger training set")
        seeds, candidates = (embeddings[:k], embeddings[k:]) if embeddings.shape[0] >= 2 * k else (None, embeddings)
        self.prototypes.copy_(greedy_k_center(candidates, k, seeds=seeds).to(self.prototypes.dtype))

    def forward(self, features: Features) -> Tensor:
        embedded = self.feature_transform(features.last).flatten(2)  # [B, D, n]
        weights = self.pooling_weights(embedded)
        pooled = torch.einsum("bdn,bn->bd", embedded, weights.to(embedded.dtype)) / embedded.shape[-1]
        return F.normalize(pooled, dim=-1)
