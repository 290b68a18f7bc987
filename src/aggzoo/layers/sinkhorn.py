"""Log-domain Sinkhorn optimal transport with a dustbin row (SALAD, A^2GC, MegaLoc).

Problem (SALAD, Izquierdo & Civera, CVPR 2024, arXiv:2311.15937, section 3): ``n`` local features
are assigned to ``m`` clusters plus one *dustbin* that absorbs uninformative features. With a score
matrix ``S: [B, m, n]`` and a learnable dustbin score ``z``, the augmented scores are
``S_aug = [S; z 1_n^T]: [B, m+1, n]`` and the entropic plan ``P = diag(e^u) exp(S_aug / reg) diag(e^v)``
has the marginals

    rows    a = [1, ..., 1, n - m] / (n + m)     (m clusters, then the dustbin)
    columns b = [1, ..., 1] / (n + m)            (n features)

so both sides carry total mass ``n / (n + m)``. After rescaling by ``n + m`` every feature column sums
to 1 (its mass is split between the clusters and the dustbin), every cluster row to 1 and the
dustbin row to ``n - m``. The dustbin's mass ``n - m`` must be positive, hence ``n > m``.

The iterations run in fp32 even under autocast: ``logsumexp`` over hundreds of entries in bf16/fp16
loses the small differences between scores that the plan is made of.

The formulation follows SuperGlue (Sarlin et al., CVPR 2020) as used by SALAD
(serizba/salad ``models/aggregators/salad.py``, GPL-3.0); re-implemented here from the equations.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["check_more_features_than_clusters", "dustbin_log_marginals", "add_dustbin", "log_sinkhorn",
           "log_optimal_transport"]


def check_more_features_than_clusters(num_features: int, num_clusters: int) -> None:
    """Raise a clear error when the dustbin would get no (or negative) mass: it needs ``n > m``."""
    if num_features <= num_clusters:
        raise ValueError(
            f"optimal-transport aggregation with a dustbin needs more local features than clusters "
            f"(n > m), got n={num_features} local features (H*W of the feature map) for "
            f"m={num_clusters} clusters. Use a larger input image (more patches: e.g. at least "
            f"{math.isqrt(num_clusters) + 1}x{math.isqrt(num_clusters) + 1} feature-map cells) or "
            f"fewer clusters (num_clusters < {num_features})."
        )


def dustbin_log_marginals(num_clusters: int, num_features: int, *, device: torch.device | str | None = None
                          ) -> tuple[Tensor, Tensor]:
    """Log-marginals of the dustbin problem, fp32.

    Returns ``log_a: [m + 1]`` (clusters, then the dustbin) and ``log_b: [n]`` (features), with
    ``a = [1, ..., 1, n - m] / (n + m)`` and ``b = 1 / (n + m)``.
    """
    check_more_features_than_clusters(num_features, num_clusters)
    log_total = math.log(num_features + num_clusters)
    log_a = torch.full((num_clusters + 1,), -log_total, dtype=torch.float32, device=device)
    log_a[-1] = math.log(num_features - num_clusters) - log_total
    log_b = torch.full((num_features,), -log_total, dtype=torch.float32, device=device)
    return log_a, log_b


def add_dustbin(scores: Tensor, dustbin: Tensor) -> Tensor:
    """``S: [B, m, n]`` and a scalar ``z`` -> ``[S; z 1^T]: [B, m + 1, n]`` (differentiable in ``z``); or a
    dustbin score per feature ``z: [B, n]`` (FoL: ``1 - guidance``) -> ``[S; z]``."""
    batch, _, num_features = scores.shape
    if dustbin.ndim == 2:
        if tuple(dustbin.shape) != (batch, num_features):
            raise ValueError(f"a per-feature dustbin must be [B, n] = [{batch}, {num_features}], got {tuple(dustbin.shape)}")
        return torch.cat([scores, dustbin.to(scores.dtype).unsqueeze(1)], dim=1)
    bin_row = dustbin.to(scores.dtype).reshape(1, 1, 1).expand(batch, 1, num_features)
    return torch.cat([scores, bin_row], dim=1)


def log_sinkhorn(log_kernel: Tensor, log_a: Tensor, log_b: Tensor, num_iters: int) -> Tensor:
    """Sinkhorn matrix scaling in the log domain.

    Args:
        log_kernel: ``[B, M, N]`` log of the Gibbs kernel (scores / reg).
        log_a: ``[M]`` or ``[B, M]`` row log-marginals.
        log_b: ``[N]`` or ``[B, N]`` column log-marginals.
        num_iters: alternating row/column updates; the last update is the column one, so the
            columns of the returned plan match ``b`` exactly.

    Returns the log plan ``log_kernel + u 1^T + 1 v^T: [B, M, N]``.
    """
    u = torch.zeros_like(log_kernel[:, :, 0])
    v = torch.zeros_like(log_kernel[:, 0, :])
    for _ in range(num_iters):
        u = log_a - torch.logsumexp(log_kernel + v.unsqueeze(1), dim=2)
        v = log_b - torch.logsumexp(log_kernel + u.unsqueeze(2), dim=1)
    return log_kernel + u.unsqueeze(2) + v.unsqueeze(1)


def log_optimal_transport(scores: Tensor, dustbin: Tensor, *, num_iters: int = 3, reg: float = 1.0) -> Tensor:
    """SALAD's assignment: entropic OT of ``n`` features to ``m`` clusters plus a dustbin.

    Args:
        scores: ``S: [B, m, n]`` feature-to-cluster scores (any float dtype, autocast or not).
        dustbin: scalar dustbin score ``z`` (SALAD learns it, init 1), or one per feature ``[B, n]`` (FoL).
        num_iters: Sinkhorn iterations (SALAD: 3).
        reg: entropic regularisation ``epsilon`` (SALAD: 1).

    Returns the fp32 log plan ``[B, m + 1, n]`` scaled by ``n + m`` (dustbin row last): every column
    sums to 1 exactly, cluster rows to ~1 and the dustbin row to ~``n - m`` (exactly at
    convergence). Raises ``ValueError`` when ``n <= m``.
    """
    _, num_clusters, num_features = scores.shape
    log_a, log_b = dustbin_log_marginals(num_clusters, num_features, device=scores.device)
    with torch.autocast(device_type=scores.device.type, enabled=False):
        log_kernel = add_dustbin(scores.float(), dustbin.float()) / reg
        log_plan = log_sinkhorn(log_kernel, log_a, log_b, num_iters)
        return log_plan + math.log(num_features + num_clusters)
