"""A model's binary codes (SelaVPR++'s hashing branch) as a model the extraction loop runs.

A binary first stage (``evaluation.search.index=BFlat``...) shortlists by the Hamming distance of these codes,
packed by :func:`pack_codes` for FAISS's binary indexes (:mod:`aggzoo.evaluation.index`), and the shortlist
is re-scored by the float descriptors.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from aggzoo.errors import ConfigError
from aggzoo.models.features import Features

__all__ = ["BinaryCodes", "pack_codes"]


def pack_codes(codes: np.ndarray) -> np.ndarray:
    """``[N, bits]`` codes in ``{-1, +1}`` -> ``[N, bits / 8]`` uint8 (bit 1 for ``+1``, most significant bit
    first: ``np.packbits``, as upstream packs them for ``faiss.IndexBinaryFlat``)."""
    codes = np.asarray(codes)
    if codes.ndim != 2 or codes.shape[1] % 8:
        raise ValueError(f"binary codes must be [N, bits] with bits a multiple of 8, got shape {codes.shape}")
    return np.packbits(codes > 0, axis=1)



class BinaryCodes(nn.Module):
    """``images [B, 3, H, W] -> [B, bits]`` codes in ``{-1, +1}``: a model's hashing branch, as a model the one
    extraction loop (:func:`extract_descriptors`) runs.

    The model's head gives ``binary_codes(features)`` (SelaVPR++ built with ``hashing=True``), on the features of
    the backbone's hashing side path (``backbone.forward_hashing``) where it has one, else on its features.

    ``with_descriptors=True``: ``[B, D + bits]``, the model's float descriptor and then the codes, from one pass of
    the backbone (``backbone.forward_branches`` where it has one: the frozen ViT runs once for both side paths);
    :meth:`split` separates the two.
    """

    def __init__(self, model: nn.Module, *, with_descriptors: bool = False) -> None:
        super().__init__()
        head = getattr(model, "head", None)
        if not callable(getattr(head, "binary_codes", None)) or not getattr(head, "bits", 0):
            raise ConfigError(f"a binary first stage (evaluation.search.index=BFlat) searches the model's binary codes, which "
                              f"{type(head if head is not None else model).__name__} does not give (SelaVPR++ built with "
                              "hashing=True does: the *.official_rerank weights); evaluate this model with a float index "
                              "(evaluation.search.index=Flat)")
        self.model = model
        self.bits = int(head.bits)
        self.with_descriptors = with_descriptors
        self.train(model.training)

    def features(self, images: torch.Tensor) -> Features:
        backbone = self.model.backbone
        hashing = getattr(backbone, "forward_hashing", None)
        return hashing(images) if callable(hashing) else backbone(images)

    def branch_features(self, images: torch.Tensor) -> tuple[Features, Features]:
        """``(float features, hashing features)``: one backbone pass where ``backbone.forward_branches`` gives
        both, else the backbone's features and :meth:`features`."""
        backbone = self.model.backbone
        branches = getattr(backbone, "forward_branches", None)
        if callable(branches):
            return branches(images)
        if callable(getattr(backbone, "forward_hashing", None)):
            return backbone(images), self.features(images)
        features = backbone(images)
        return features, features

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if not self.with_descriptors:
            return self.model.head.binary_codes(self.features(images))
        float_features, hashing_features = self.branch_features(images)
        descriptors = self.model.head(float_features)
        codes = self.model.head.binary_codes(hashing_features)
        return torch.cat([descriptors, codes.to(descriptors.dtype)], dim=1)

    def split(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``[N, D + bits]`` rows of the ``with_descriptors`` output -> (``[N, D]`` descriptors, a view -- of the
        memory-mapped file too -- and ``[N, bits / 8]`` packed codes, :func:`pack_codes`)."""
        return rows[:, :-self.bits], pack_codes(rows[:, -self.bits:])

