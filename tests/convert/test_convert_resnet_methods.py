"""Official ResNet-based checkpoints (BoQ-R50, MixVPR, ConvAP, CosPlace, EigenPlaces, NetVLAD and GeM of the
benchmark): a file with the upstream key names and shapes (torchvision's own ResNet names, the
upstream wrappers' prefixes) loads strictly and every tensor lands where it belongs.

The ResNets are at the paper depth (50); ResNet-101 variants share the same rules.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from official_layouts import assert_placed, fill, multihead_attention, prefixed, save, torchvision_resnet

import aggzoo

# torchvision child index -> name, as nn.Sequential(*resnet.children()) numbers them
_CHILD = {"0": "conv1", "1": "bn1", "4": "layer1", "5": "layer2", "6": "layer3", "7": "layer4"}


def _sequential_to_timm(key: str, prefix: str) -> str:
    index, _, rest = key[len(prefix):].partition(".")
    return f"backbone.model.{_CHILD[index]}.{rest}"


def test_boq_resnet50_official(tmp_path: Path) -> None:
    p = 512
    aggregator = [("proj_c.weight", (p, 1024, 3, 3)), ("proj_c.bias", (p,)),
                  ("norm_input.weight", (p,)), ("norm_input.bias", (p,)), ("fc.weight", (32, 128)), ("fc.bias", (32,))]
    for i in range(2):
        b = f"boqs.{i}."
        aggregator += multihead_attention(b + "encoder.self_attn.", p)
        aggregator += [(b + f"encoder.{n}", s) for n, s in [
            ("linear1.weight", (4 * p, p)), ("linear1.bias", (4 * p,)), ("linear2.weight", (p, 4 * p)),
            ("linear2.bias", (p,)), ("norm1.weight", (p,)), ("norm1.bias", (p,)), ("norm2.weight", (p,)),
            ("norm2.bias", (p,))]]
        aggregator += [(b + "queries", (1, 64, p))] + multihead_attention(b + "self_attn.", p)
        aggregator += [(b + "norm_q.weight", (p,)), (b + "norm_q.bias", (p,))] + multihead_attention(b + "cross_attn.", p)
        aggregator += [(b + "norm_out.weight", (p,)), (b + "norm_out.bias", (p,))]
    # Bag-of-Queries backbones.py: self.net = nn.Sequential(conv1, bn1, relu, maxpool, layer1, layer2, layer3)
    upstream = fill(prefixed("backbone.net.", torchvision_resnet(50, last_layer=3, sequential=True))
                    + prefixed("aggregator.", aggregator))
    path = save(upstream, tmp_path / "resnet50_16384.pth")
    model = aggzoo.create_model("boq_resnet50.official", checkpoint_path=path)
    mapping = {k: _sequential_to_timm(k, "backbone.net.") if k.startswith("backbone.") else k.replace("aggregator.", "head.")
               for k in upstream}
    assert_placed(model, upstream, mapping)
    assert model.out_dim == 16384


@pytest.mark.parametrize("tag, channels, rows", [("official", 1024, 4), ("official_128", 64, 2)])
def test_mixvpr_official(tmp_path: Path, tag: str, channels: int, rows: int) -> None:
    aggregator = []
    for i in range(4):  # FeatureMixerLayer.mix = Sequential(LayerNorm, Linear, ReLU, Linear)
        aggregator += [(f"mix.{i}.mix.0.weight", (400,)), (f"mix.{i}.mix.0.bias", (400,)),
                       (f"mix.{i}.mix.1.weight", (400, 400)), (f"mix.{i}.mix.1.bias", (400,)),
                       (f"mix.{i}.mix.3.weight", (400, 400)), (f"mix.{i}.mix.3.bias", (400,))]
    aggregator += [("channel_proj.weight", (channels, 1024)), ("channel_proj.bias", (channels,)),
                   ("row_proj.weight", (rows, 400)), ("row_proj.bias", (rows,))]
    upstream = fill(prefixed("backbone.model.", torchvision_resnet(50, last_layer=3)) + prefixed("aggregator.", aggregator))
    # The README loads the file with model.load_state_dict(torch.load(...)); accept the Lightning form too.
    checkpoint = upstream if tag == "official" else {"state_dict": upstream, "epoch": 79}
    path = save(checkpoint, tmp_path / "mixvpr.ckpt")
    model = aggzoo.create_model(f"mixvpr_resnet50.{tag}", checkpoint_path=path)
    mapping = {k: k if k.startswith("backbone.") else k.replace("aggregator.", "head.") for k in upstream}
    assert_placed(model, upstream, mapping)
    assert model.out_dim == channels * rows


@pytest.mark.parametrize("tag, channels", [("official_512", 128)])
def test_convap_official(tmp_path: Path, tag: str, channels: int) -> None:
    aggregator = [("channel_pool.weight", (channels, 2048, 1, 1)), ("channel_pool.bias", (channels,))]
    upstream = fill(prefixed("backbone.model.", torchvision_resnet(50, last_layer=4)) + prefixed("aggregator.", aggregator))
    path = save(upstream, tmp_path / f"resnet50_ConvAP_{channels}_2x2.ckpt")
    model = aggzoo.create_model(f"convap_resnet50.{tag}", checkpoint_path=path)
    mapping = {k: k if k.startswith("backbone.") else k.replace("aggregator.", "head.") for k in upstream}
    assert_placed(model, upstream, mapping)
    assert model.out_dim == 4 * channels


@pytest.mark.parametrize("name, dim", [("cosplace_resnet50.official_512", 512), ("eigenplaces_resnet50.official", 2048)])
def test_gmberton_geolocalization_net(tmp_path: Path, name: str, dim: int) -> None:
    # GeoLocalizationNet: backbone = Sequential(*children[:-2]); aggregation = Sequential(L2Norm, GeM, Flatten, Linear, L2Norm)
    aggregation = [("aggregation.1.p", (1,)), ("aggregation.3.weight", (dim, 2048)), ("aggregation.3.bias", (dim,))]
    upstream = fill(prefixed("backbone.", torchvision_resnet(50, last_layer=4, sequential=True)) + aggregation)
    path = save(upstream, tmp_path / "ResNet50_cosplace.pth")
    model = aggzoo.create_model(name, checkpoint_path=path)
    mapping = {k: _sequential_to_timm(k, "backbone.") if k.startswith("backbone.") else "head." + k for k in upstream}
    assert_placed(model, upstream, mapping)
    assert model.out_dim == dim


def test_netvlad_benchmark(tmp_path: Path) -> None:
    # resnet50conv4: Sequential(*children[:-3]) (cut after layer3) + the NetVLAD module as `aggregation`
    aggregation = [("aggregation.centroids", (64, 1024)), ("aggregation.conv.weight", (64, 1024, 1, 1))]
    upstream = fill(prefixed("backbone.", torchvision_resnet(50, last_layer=3, sequential=True)) + aggregation)
    # util.py resume_model: training checkpoints are {"model_state_dict": ...}, maybe with "module."
    checkpoint = {"model_state_dict": {f"module.{k}": v for k, v in upstream.items()}, "epoch_num": 5, "best_r5": 90.1}
    path = save(checkpoint, tmp_path / "best_model.pth")
    model = aggzoo.create_model("netvlad_resnet50.official", checkpoint_path=path)
    mapping = {k: _sequential_to_timm(k, "backbone.") if k.startswith("backbone.") else k.replace("aggregation.", "head.")
               for k in upstream}
    assert_placed(model, upstream, mapping)
    assert model.out_dim == 65536


def test_gem_benchmark() -> None:
    """resnet50conv4 + --aggregation gem --l2 before_pool: aggregation = Sequential(L2Norm, GeM, Flatten).
    The backbone rules are NetVLAD's (loaded for real above), so the layout is checked on the meta device:
    the converted keys and shapes are exactly the model's."""
    from aggzoo.hub.factory import get_pretrained_cfg
    from aggzoo.zoo.gem import convert_gem_benchmark

    upstream = prefixed("backbone.", torchvision_resnet(50, last_layer=3, sequential=True)) + [("aggregation.1.p", (1,))]
    with torch.device("meta"):
        model = aggzoo.create_model("gem_resnet50conv4")
        converted = convert_gem_benchmark({k: torch.empty(shape) for k, shape in upstream}, model)
    expected = {_sequential_to_timm(k, "backbone.") if k.startswith("backbone.") else "head.pool.p": tuple(shape)
                for k, shape in upstream}
    assert {k: tuple(v.shape) for k, v in converted.items()} == expected
    assert expected == {k: tuple(v.shape) for k, v in model.state_dict().items()}  # strict: nothing missing or extra
    assert model.out_dim == 1024 and model.head.l2 == "before_pool"
    assert get_pretrained_cfg("gem_resnet50conv4.official").eval_metric == "l2"  # dVGL's test.py: faiss.IndexFlatL2


def test_a_conv5_checkpoint_is_not_silently_cut(tmp_path: Path) -> None:
    """A NetVLAD file of resnet50conv5 (layer4 present) must fail, naming layer4, not load partially."""
    from aggzoo.errors import StateDictMismatchError

    aggregation = [("aggregation.centroids", (64, 2048)), ("aggregation.conv.weight", (64, 2048, 1, 1))]
    upstream = fill(prefixed("backbone.", torchvision_resnet(50, last_layer=4, sequential=True)) + aggregation)
    path = save(upstream, tmp_path / "conv5.pth")
    with pytest.raises(StateDictMismatchError, match="backbone.model.layer4"):
        aggzoo.create_model("netvlad_resnet50.official", checkpoint_path=path)
