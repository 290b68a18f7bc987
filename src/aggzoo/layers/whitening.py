"""Fixed affine whitening ``x -> P (x - m)`` of descriptors, learned offline (PCA) and applied inside a model.

Image-retrieval models whiten their global descriptors with a projection fitted after training:
NetVLAD's PCA-whitening to 4096-D (Arandjelovic et al., CVPR 2016), the SFRS release (Ge et al., ECCV
2020), AP-GeM's PCA-whitening learned on Landmarks-clean (Revaud et al., ICCV 2019) and cirtorch's
learned whitening ``Lw`` (Radenovic et al., TPAMI 2018). In every case it is one affine map of a
``[B, D_in]`` descriptor, so it is a :class:`torch.nn.Linear` with ``weight = P`` and ``bias = -P m``:
a plain layer whose state-dict keys (``weight``, ``bias``) hold the whole transform, which exports and
runs on any device like the rest of the model.

:func:`pca_whitening_projection` builds ``P`` from a PCA (sklearn's ``PCA`` fields), with the power
and multiplier of naver/deep-image-retrieval's ``whiten_features``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["AffineWhitening", "pca_whitening_projection"]


def pca_whitening_projection(components: Tensor, explained_variance: Tensor | None, *, power: float = 0.5,
                             multiplier: float = 1.0) -> Tensor:
    """``P = diag(multiplier * variance^power)^-1 U``: the PCA projection ``U`` ``[D_out, D_in]`` (rows =
    principal axes, sklearn's ``components_``), each row divided by ``multiplier * lambda_j^power``.

    ``power = 0.5`` is full whitening; ``explained_variance = None`` keeps the plain projection (an sklearn
    PCA fitted with ``whiten=False``). Computed in float64: small variances raised to a power lose digits.
    """
    projection = components.double()
    if explained_variance is None:
        return projection
    if explained_variance.shape != (components.shape[0],):
        raise ValueError(f"explained_variance of shape {tuple(explained_variance.shape)} does not match "
                         f"{components.shape[0]} components")
    scale = multiplier * explained_variance.double().pow(power)
    return projection / scale[:, None]


class AffineWhitening(nn.Linear):
    """``x: [B, D_in] -> P (x - m): [B, D_out]`` as a linear layer (``weight = P``, ``bias = -P m``).

    Built like :class:`torch.nn.Linear` (random until loaded); :meth:`set_whitening` writes a fitted
    ``(P, m)``. Checkpoints that store the transform as a Linear or 1x1 convolution load into
    ``weight``/``bias`` directly.
    """

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__(in_features, out_features, bias=True)

    @torch.no_grad()
    def set_whitening(self, projection: Tensor, mean: Tensor) -> None:
        """Write ``P`` ``[D_out, D_in]`` and ``m`` ``[D_in]`` (computed in float64, stored in the layer's dtype)."""
        if tuple(projection.shape) != (self.out_features, self.in_features):
            raise ValueError(f"expected a projection of shape {(self.out_features, self.in_features)}, "
                             f"got {tuple(projection.shape)}")
        if tuple(mean.shape) != (self.in_features,):
            raise ValueError(f"expected a mean of shape {(self.in_features,)}, got {tuple(mean.shape)}")
        p64 = projection.double()
        self.weight.copy_(p64.to(self.weight.dtype))
        self.bias.copy_((-(p64 @ mean.double())).to(self.bias.dtype))
