"""A^2GC-VPR: asymmetric aggregation with geometric constraints.

Z. Li, T. Shang, "A^2GC: Asymmetric Aggregation with Geometric Constraints for Locally Aggregated
Descriptors", CVPR 2026, arXiv:2511.14109. Original code: CV4RA/A2GC
``models/aggregators/a2gc.py`` (README says MIT; no licence file). The upstream code does not run
(syntax error, a solver variable used before assignment, an undefined solver, a class name that
does not exist); this is a re-implementation of the paper's math, no code taken from it.

SALAD (:class:`~aggzoo.models.heads.salad.SALAD`: same MLPs, dustbin, l-major layout, 8448-D at
m=64, l=128, g=256) with two changes to the assignment:

1. *Geometric constraint.* Each position ``p_i`` of the ``H x W`` grid, as ``(x, y)`` in ``[-1, 1]``,
   is embedded by a 1x1 conv ``phi(p_i) = W_g p_i + b_g`` (2 -> 16) and compared with a learned
   geometry vector ``gamma_k`` per cluster: ``S_ki <- S_ki + lambda gamma_k . phi(p_i)``, lambda = 0.15.
2. *Asymmetric solver.* On the dustbin-augmented log scores ``Z`` (marginals as in SALAD), repeat
   ``Z <- (log_softmax_rows(Z) + log_softmax_cols(Z)) / 2`` three times, then calibrate the rows
   once (``Z <- Z + log a - logsumexp_rows(Z)``) and the columns once
   (``Z <- Z + log b - logsumexp_cols(Z)``). The columns therefore match their marginals exactly; the
   rows only approximately (exactly when ``Z`` is separable, ``Z_ki = r_k + c_i``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from aggzoo.layers.sinkhorn import add_dustbin, dustbin_log_marginals
from aggzoo.models.heads.salad import SALAD

__all__ = ["A2GC", "asymmetric_log_plan", "coordinate_grid"]


def asymmetric_log_plan(log_scores: Tensor, log_a: Tensor, log_b: Tensor, num_iters: int) -> Tensor:
    """A^2GC's solver on log scores ``Z: [B, M, N]`` with row/column log-marginals ``[M]``/``[N]``.

    ``num_iters`` averaged row/column log-normalisations, then one row and one column calibration.
    Returns the log plan ``[B, M, N]`` whose columns sum to ``b`` exactly.
    """
    z = log_scores
    for _ in range(num_iters):
        # mean of the row-normalised and the column-normalised log matrices
        z = z - 0.5 * torch.logsumexp(z, dim=2, keepdim=True) - 0.5 * torch.logsumexp(z, dim=1, keepdim=True)
    z = z + (log_a - torch.logsumexp(z, dim=2)).unsqueeze(2)
    return z + (log_b - torch.logsumexp(z, dim=1)).unsqueeze(1)


def coordinate_grid(height: int, width: int, *, device: torch.device | str | None = None) -> Tensor:
    """Normalised positions ``[1, 2, H, W]``: channel 0 is x (along W), channel 1 is y (along H),
    both spanning ``[-1, 1]`` (row-major order matches the flattened feature map)."""
    ys = torch.linspace(-1.0, 1.0, height, device=device)
    xs = torch.linspace(-1.0, 1.0, width, device=device)
    yy, xx = torch.meshgrid(ys, xs, indexing="ij")
    return torch.stack([xx, yy]).unsqueeze(0)


class A2GC(SALAD):
    """A^2GC-VPR head.

    Args:
        in_channels: ``C`` of the patch map and CLS token (768 for DINOv2 ViT-B/14).
        num_clusters: ``m`` (64). Needs ``n = H*W > m``.
        cluster_dim: ``l`` (128).
        token_dim: ``g`` (256).
        dropout: MLP dropout (0.3).
        num_iters: averaged row/column normalisations before the calibration (3).
        geo_dim: dimension of the coordinate embedding and cluster geometry vectors (16).
        geo_lambda: weight ``lambda`` of the geometric compatibility score (0.15).

    Shapes: ``Features(maps=(..., [B, C, H, W]), cls=[B, C]) -> [B, g + m*l]`` (8448), ``H*W > m``.
    Keys as upstream: SALAD's plus ``geo_proj.{weight,bias}`` and ``cluster_geo: [m, geo_dim]``.
    """

    def __init__(
        self,
        in_channels: int,
        *,
        num_clusters: int = 64,
        cluster_dim: int = 128,
        token_dim: int = 256,
        dropout: float = 0.3,
        num_iters: int = 3,
        geo_dim: int = 16,
        geo_lambda: float = 0.15,
    ) -> None:
        super().__init__(in_channels, num_clusters=num_clusters, cluster_dim=cluster_dim, token_dim=token_dim,
                         dropout=dropout)
        self.num_iters = num_iters
        self.geo_lambda = geo_lambda
        self.geo_proj = nn.Conv2d(2, geo_dim, kernel_size=1)
        self.cluster_geo = nn.Parameter(0.02 * torch.randn(num_clusters, geo_dim))

    def geometric_scores(self, height: int, width: int) -> Tensor:
        """Image-independent compatibility ``gamma_k . phi(p_i)``: ``[m, H*W]`` in fp32."""
        coords = coordinate_grid(height, width, device=self.cluster_geo.device)
        with torch.autocast(device_type=coords.device.type, enabled=False):
            embedded = nn.functional.conv2d(coords, self.geo_proj.weight.float(), self.geo_proj.bias.float())
            return self.cluster_geo.float() @ embedded[0].flatten(1)  # [m, g] @ [g, n]

    def assignment(self, scores: Tensor, grid_size: tuple[int, int]) -> Tensor:
        """``S: [B, m, n]`` -> ``P: [B, m, n]`` fp32, each feature's column (with the dustbin) summing to 1."""
        _, num_clusters, num_features = scores.shape
        log_a, log_b = dustbin_log_marginals(num_clusters, num_features, device=scores.device)
        with torch.autocast(device_type=scores.device.type, enabled=False):
            fused = scores.float() + self.geo_lambda * self.geometric_scores(*grid_size)
            log_plan = asymmetric_log_plan(add_dustbin(fused, self.dust_bin.float()), log_a, log_b, self.num_iters)
            # Scale by n + m so feature columns sum to 1 as in SALAD; the per-cluster L2
            # normalisation makes the descriptor independent of this factor.
            return (log_plan[:, :-1] + math.log(num_features + num_clusters)).exp()
