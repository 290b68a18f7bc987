"""CosPlace / EigenPlaces: closed form at p = 1 with an identity projection, official keys."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from aggzoo.models.features import Features
from aggzoo.models.heads.cosplace import CosPlace


def test_p1_identity_projection_is_mean_of_normalised_features() -> None:
    torch.manual_seed(0)
    head = CosPlace(6, out_dim=6, p=1.0)
    with torch.no_grad():
        head.aggregation[3].weight.copy_(torch.eye(6))
        head.aggregation[3].bias.zero_()
    x = torch.randn(3, 6, 5, 4).abs() + 0.1  # positive, so the GeM clamp does not act
    with torch.no_grad():
        out = head(Features((x,)))
    expected = F.normalize(F.normalize(x, dim=1).mean(dim=(2, 3)), dim=1)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)


def test_gem_exponent_is_learned_and_changes_the_output() -> None:
    torch.manual_seed(0)
    head = CosPlace(4, out_dim=3)
    assert head.aggregation[1].p.requires_grad
    x = torch.rand(2, 4, 3, 3) + 0.05
    with torch.no_grad():
        before = head(Features((x,)))
        head.aggregation[1].p.fill_(1.0)
        after = head(Features((x,)))
    assert not torch.allclose(before, after)


def test_official_keys_and_paper_sizes() -> None:
    head = CosPlace(2048, out_dim=2048)  # released ResNet-50/101 model
    assert set(head.state_dict()) == {"aggregation.1.p", "aggregation.3.weight", "aggregation.3.bias"}
    assert sum(p.numel() for p in head.parameters()) == 1 + 2048 * 2048 + 2048
    with torch.no_grad():
        out = head(Features((torch.rand(2, 2048, 10, 10),)))
    assert out.shape == (2, 2048)
    assert CosPlace(2048).out_dim == 512
