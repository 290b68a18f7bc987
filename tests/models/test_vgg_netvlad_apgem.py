"""The pieces of netvlad_vgg16 / sfrs_vgg16 / apgem_resnet101 that are not plain reuse: VGG16 read before the
last ReLU, NetVLAD's optional whitening, and the AP-GeM head, each against a direct computation."""

from __future__ import annotations

import timm
import torch
import torch.nn.functional as F

from aggzoo.models.backbones.vgg import PreActivationVGG
from aggzoo.models.features import Features
from aggzoo.models.heads.apgem import APGeM
from aggzoo.models.heads.gem import GeM
from aggzoo.models.heads.netvlad import NetVLAD


def test_vgg16_conv5_3_before_relu() -> None:
    torch.manual_seed(0)
    backbone = PreActivationVGG("vgg16", out_indices=[4]).eval()
    reference = timm.create_model("vgg16", pretrained=False, num_classes=0).eval()
    reference.load_state_dict(backbone.model.state_dict(), strict=False)
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        ours = backbone(x).last
        conv5_3 = reference.features[:29](x)  # torchvision/timm index 28 is conv5_3; 29 its ReLU
    assert ours.shape == (1, 512, 4, 6) and backbone.out_channels == 512
    assert torch.equal(ours, conv5_3)
    assert (ours < 0).any()  # the raw responses, which the timm level (after the ReLU) would clip


def test_netvlad_whitening_is_affine_then_l2() -> None:
    torch.manual_seed(0)
    head = NetVLAD(8, num_clusters=4, whiten_dim=5).eval()
    plain = NetVLAD(8, num_clusters=4).eval()
    plain.load_state_dict({k: v for k, v in head.state_dict().items() if not k.startswith("whiten.")})
    features = Features(maps=(torch.randn(2, 8, 3, 3),))
    with torch.no_grad():
        vlad = plain(features)
        expected = F.normalize(vlad @ head.whiten.weight.T + head.whiten.bias, dim=1)
        assert torch.allclose(head(features), expected, atol=1e-6)
    assert head.out_dim == 5 and plain.out_dim == 32


def test_apgem_head_is_gem_fc_l2_whiten_l2() -> None:
    torch.manual_seed(0)
    head = APGeM(6, out_dim=4).eval()
    x = torch.rand(2, 6, 5, 5)
    p = head.gem.pool.p
    with torch.no_grad():
        pooled = x.clamp(min=1e-6).pow(p).mean(dim=(2, 3)).pow(1 / p)  # dirtorch GeneralizedMeanPoolingP
        y = F.normalize(head.fc(pooled), dim=1)
        expected = F.normalize(head.whiten(y), dim=1)
        assert torch.allclose(head(Features(maps=(x,))), expected, atol=1e-6)
    normed = APGeM(6, out_dim=4, norm_features=True, whiten=False)
    assert isinstance(normed.gem, GeM) and normed.gem.l2 == "after_pool" and normed.whiten is None
    assert head.no_weight_decay() == {"gem.pool.p"} and set(head.lr_multipliers()) == {"gem.pool.p"}
