"""SelaVPR++'s hashing loss against independent expectations: with z equal to the normalised codes the
similarity term vanishes (the loss is the metric loss on the codes), a brute-force loop over the mined pairs
otherwise, and the gradient reaching z through the codes' straight-through estimator."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pytorch_metric_learning import losses, miners

from aggzoo.layers.binarize import sign_ste
from aggzoo.training.losses import HashingLoss, MetricLoss

BITS = 16


def _parts() -> tuple[torch.nn.Module, torch.nn.Module]:
    return losses.MultiSimilarityLoss(alpha=1.0, beta=50.0, base=0.0), miners.MultiSimilarityMiner(epsilon=0.1)


def _batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(4).repeat_interleave(3)
    centres = torch.randn(4, BITS, generator=gen)
    z = F.normalize(centres[labels] + 0.8 * torch.randn(12, BITS, generator=gen), dim=1)
    return z, labels


def test_zero_gap_leaves_the_metric_loss_on_the_codes() -> None:
    z, labels = _batch(0)
    b = sign_ste(z)
    loss, miner = _parts()
    got = HashingLoss(loss, miner)(b / BITS ** 0.5, b, labels)  # z . z = b . b / bits exactly
    torch.testing.assert_close(got, MetricLoss(loss, miner)(b, labels))


def test_similarity_term_by_brute_force_and_gradient_through_the_codes() -> None:
    z, labels = _batch(1)
    z.requires_grad_(True)
    b = sign_ste(z)
    loss, miner = _parts()
    got = HashingLoss(loss, miner, weight=0.1)(z, b, labels)
    with torch.no_grad():
        a1, p, a2, n = miner(b, labels)
        pairs = list(zip(a1.tolist(), p.tolist())) + list(zip(a2.tolist(), n.tolist()))
        assert pairs
        gaps = [float(z[i] @ z[j] - b[i] @ b[j] / BITS) ** 2 for i, j in pairs]
        expected = loss(b, labels, (a1, p, a2, n)) + 0.1 * sum(gaps) / len(gaps)
    torch.testing.assert_close(got.detach(), expected)
    got.backward()
    assert z.grad is not None and z.grad.abs().sum() > 0
