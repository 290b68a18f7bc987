"""CricaVPR against independent expectations: upstream's literal grid slices, a hand-built regional
descriptor, the adapter's closed form on the CLS token and its receptive field, the adapted ViT at
initialisation against timm's own forward, and the cross-image encoder across the batch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from aggzoo.layers.pooling import gem
from aggzoo.models.backbones.multiconv_adapter import MultiConvAdapter, MultiConvAdapterViT
from aggzoo.models.backbones.timm_backbone import TimmBackbone
from aggzoo.models.features import Features
from aggzoo.models.heads.cricavpr import CricaVPR, grid_cuts

# Lu-Feng/CricaVPR network.py slices of its 16 x 16 map.
UPSTREAM_2x2 = [(slice(0, 8), slice(0, 8)), (slice(0, 8), slice(8, None)), (slice(8, None), slice(0, 8)),
                (slice(8, None), slice(8, None))]
_THIRDS = [slice(0, 5), slice(5, 11), slice(11, None)]
UPSTREAM_3x3 = [(r, c) for r in _THIRDS for c in _THIRDS]


def test_grid_cuts_reproduce_upstreams_slices_at_16() -> None:
    assert grid_cuts(16, 2) == [0, 8, 16] and grid_cuts(16, 3) == [0, 5, 11, 16]
    assert grid_cuts(23, 3) == [0, 8, 15, 23] and grid_cuts(3, 3) == [0, 1, 2, 3]


def test_regional_descriptor_by_hand_at_the_paper_map_size() -> None:
    head = CricaVPR(32, cross_image=False).eval()
    with torch.no_grad():
        head.gem.p.fill_(2.5)
    gen = torch.Generator().manual_seed(0)
    x, cls = torch.randn(2, 32, 16, 16, generator=gen), torch.randn(2, 32, generator=gen)
    normed = F.normalize(x, dim=1)
    parts = [cls] + [gem(normed[:, :, r, c], 2.5) for r, c in UPSTREAM_2x2 + UPSTREAM_3x3]
    expected = F.normalize(torch.cat(parts, dim=1), dim=1)
    torch.testing.assert_close(head(Features((x,), cls=cls)), expected)
    assert head.out_dim == 14 * 32 and not head.batch_dependent


def test_cross_image_encoder_attends_across_the_batch_per_position() -> None:
    torch.manual_seed(0)
    head = CricaVPR(32, encoder_heads=4, encoder_ffn_dim=64).eval()
    assert head.batch_dependent
    gen = torch.Generator().manual_seed(1)
    x, cls = torch.randn(4, 32, 6, 6, generator=gen), torch.randn(4, 32, generator=gen)
    with torch.no_grad():
        out = head(Features((x,), cls=cls))
        tokens = head.region_tokens(Features((x,), cls=cls))  # [B, 14, C]
        per_position = [head.encoder(tokens[:, t:t + 1])[:, 0] for t in range(14)]
        torch.testing.assert_close(out, F.normalize(torch.cat(per_position, dim=1), dim=1), rtol=1e-5, atol=1e-6)
        alone = head(Features((x[:1],), cls=cls[:1]))
        assert (alone[0] - out[0]).abs().max() > 1e-4  # other companions, another descriptor
    with pytest.raises(ValueError, match="3x3 grid"):
        head(Features((x[:, :, :2],), cls=cls))


def test_adapter_cls_closed_form_and_receptive_field() -> None:
    torch.manual_seed(0)
    adapter = MultiConvAdapter(64).eval()
    for p in adapter.parameters():
        torch.nn.init.normal_(p, std=0.2)
    grid, prefix = (6, 7), 2
    n = torch.randn(1, prefix + 42, 64)
    with torch.no_grad():
        out = adapter(n, grid, prefix)
        # Prefix tokens skip the convolutions and are added to themselves: fc2(2 ReLU(fc1(n))).
        torch.testing.assert_close(out[:, :prefix], adapter.D_fc2(2 * F.relu(adapter.D_fc1(n[:, :prefix]))))
        changed = n.clone()
        changed[:, prefix + 0] += 1.0  # the patch at row 0, col 0
        delta = (adapter(changed, grid, prefix) - out).abs().amax(dim=-1)[0, prefix:].view(grid)
    # The 5x5 branch reaches 2 rows/cols away; farther patches and the prefix tokens do not move.
    assert delta[0, 0] > 0 and delta[3:].max() == 0 and delta[:, 3:].max() == 0
    torch.testing.assert_close(adapter(changed, grid, prefix)[:, :prefix], out[:, :prefix])


def test_adapted_vit_at_initialisation_is_the_pretrained_vit() -> None:
    # fc2 starts at zero (upstream train.py): the adapters add nothing, whatever the input size.
    torch.manual_seed(0)
    adapted = MultiConvAdapterViT("vit_small_patch14_dinov2", depth=2, embed_dim=64, num_heads=2,
                                  dynamic_img_size=True).eval()
    plain = TimmBackbone("vit_small_patch14_dinov2", depth=2, embed_dim=64, num_heads=2, dynamic_img_size=True).eval()
    plain.model.load_state_dict(adapted.model.state_dict())
    images = torch.randn(2, 3, 56, 70)
    with torch.no_grad():
        a, b = adapted(images), plain(images)
    torch.testing.assert_close(a.last, b.last) and torch.testing.assert_close(a.cls, b.cls)
    trainable = {n.split(".")[0] for n, p in adapted.named_parameters() if p.requires_grad}
    assert trainable == {"adapters"}
