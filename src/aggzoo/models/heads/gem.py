"""GeM: generalized-mean pooling.

F. Radenovic, G. Tolias, O. Chum, "Fine-tuning CNN Image Retrieval with No Human Annotation",
TPAMI 2018, arXiv:1711.02512. Original code: filipradenovic/cnnimageretrieval-pytorch (MIT).

``x: [B, C, H, W] -> (mean_i clamp(x_i, eps)^p)^(1/p) -> L2 -> [B, C]``, p learnable (init 3).
Upstream trains ``p`` with a 10x learning rate and no weight decay; the head declares it
(:meth:`GeM.no_weight_decay`, :meth:`GeM.lr_multipliers`) and the optimiser's parameter groups read it.

Where the L2 normalisation goes is an option, named as gmberton/deep-visual-geo-localization-benchmark's
``--l2`` (MIT): ``after_pool`` (Radenovic et al.; our default), ``before_pool`` (L2 over the channels at
every position, then GeM, no final L2: that benchmark's default, so the GeM models it trained reproduce)
and ``none``.

``whiten=D`` adds a learned whitening FC ``Linear(C -> D)`` (with bias) between the pooling and the final L2:
DELG's global head (Cao et al., ECCV 2020, arXiv:2001.05027; tensorflow/models ``research/delf`` ``delg_model.py``,
Apache-2.0: GeM p = 3 fixed, the 2048-D "embedding layer", L2, then the ArcFace classifier), and the R-GeM
whitening layer of Radenovic et al. trained end to end.

``before_pool`` and ``none`` break the head contract (:mod:`aggzoo.models.heads.base`, docs/architecture.md:
heads return unit-norm rows): their descriptors are not unit-norm.
Inner-product search then ranks them otherwise than the benchmark, which searches by L2 distance
(``faiss.IndexFlatL2`` in its ``test.py``): evaluate them with ``evaluation.search.metric=l2`` (the default of
the ``gem_resnet50conv4`` weights, whose cfg states it). Training losses and validation in aggzoo assume
unit-norm descriptors; ``after_pool`` is the one to train with here.
"""

from __future__ import annotations

from typing import Literal

import torch.nn.functional as F
from torch import Tensor, nn

from aggzoo.layers.pooling import GEM_P_LR_MULTIPLIER, GeMPool
from aggzoo.models.features import Features
from aggzoo.models.heads.base import Head
from aggzoo.models.heads.gemplus import GeMPlus

__all__ = ["GeM", "L2_PLACEMENTS"]

#: where the L2 normalisation is applied (the benchmark's ``--l2`` choices)
L2_PLACEMENTS = ("after_pool", "before_pool", "none")


class GeM(Head):
    """GeM pooling of the last map followed by L2 normalisation.

    Args:
        in_channels: ``C`` of the last map; the descriptor has ``D = C``.
        p: initial exponent (paper: 3). ``p = 1`` is average pooling, ``p -> inf`` max pooling.
        eps: clamp floor that keeps ``x^p`` defined for non-positive activations.
        learn_p: train ``p`` (paper; 10x learning rate, no weight decay) or keep it fixed.
        l2: ``after_pool`` (paper), ``before_pool`` (L2 over channels per position, no final L2: the
            dVGL benchmark's default) or ``none``. Only ``after_pool`` gives unit-norm rows (the head
            contract); the other two are for the benchmark's weights, searched by L2 distance.
        whiten: ``D`` of a learned whitening FC after the pooling (``None``: none, ``D = C``).

    Shapes: ``Features(maps=(..., [B, C, H, W])) -> [B, C]`` (``[B, whiten]`` with a whitening FC).
    """

    def __init__(self, in_channels: int, *, p: float = 3.0, eps: float = 1e-6, learn_p: bool = True,
                 l2: Literal["after_pool", "before_pool", "none"] = "after_pool", whiten: int | None = None) -> None:
        super().__init__()
        if l2 not in L2_PLACEMENTS:
            raise ValueError(f"GeM l2 must be one of {', '.join(L2_PLACEMENTS)}, got {l2!r}")
        self.in_channels = in_channels
        self.out_dim = whiten or in_channels
        self.l2 = l2
        self.pool = GeMPool(p=p, eps=eps, learn_p=learn_p)
        self.whiten = nn.Linear(in_channels, whiten) if whiten else None

    def forward(self, features: Features) -> Tensor:
        x = features.last
        if self.l2 == "before_pool":
            x = F.normalize(x, dim=1)
        pooled = self.pool(x)
        if self.whiten is not None:
            pooled = self.whiten(pooled)
        return F.normalize(pooled, dim=-1) if self.l2 == "after_pool" else pooled

    def with_superglobal_pooling(self) -> GeMPlus:
        """SuperGlobal's pooling in place of this GeM (its test-time swap,
        :func:`aggzoo.models.superglobal.superglobal_model`): regional GeM, GeM+ with p fixed at 4.6, L2."""
        return GeMPlus(self.in_channels)

    def no_weight_decay(self) -> set[str]:
        return {"pool.p"}

    def lr_multipliers(self) -> dict[str, float]:
        return {"pool.p": GEM_P_LR_MULTIPLIER}
