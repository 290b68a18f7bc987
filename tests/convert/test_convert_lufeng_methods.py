"""Official checkpoints of Lu-Feng's methods (SuperVLAD, 1-cluster VLAD): a file with the upstream key
names and shapes (each converter's docstring cites the upstream files) loads strictly and every
tensor lands where it belongs. The ViT is cut to 2 blocks (block keys are renamed by index)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from official_layouts import DINOV2_DIM, Shapes, assert_placed, dinov2_hub, fill, multihead_attention, prefixed, save

import aggzoo
from aggzoo.errors import StateDictMismatchError

DEPTH = 2
SMALL_VIT = {"depth": DEPTH, "frozen_stages": 0}
C = DINOV2_DIM


def cross_image_encoder(prefix: str, *, layers: int = 2, ffn: int = 2048) -> Shapes:
    """``nn.TransformerEncoder(nn.TransformerEncoderLayer(768, 16, 2048), 2)`` names (Lu-Feng/SuperVLAD
    ``model/network.py``, Lu-Feng/CricaVPR ``network.py``)."""
    out: Shapes = []
    for i in range(layers):
        p = f"{prefix}layers.{i}."
        out += multihead_attention(p + "self_attn.", C)
        out += [(p + "linear1.weight", (ffn, C)), (p + "linear1.bias", (ffn,)),
                (p + "linear2.weight", (C, ffn)), (p + "linear2.bias", (C,)),
                (p + "norm1.weight", (C,)), (p + "norm1.bias", (C,)),
                (p + "norm2.weight", (C,)), (p + "norm2.bias", (C,))]
    return out


def _data_parallel_file(upstream: dict[str, torch.Tensor], path: Path) -> Path:
    # train.py / util.py: torch.save({"model_state_dict": DataParallel(model).state_dict(), ...})
    return save({"model_state_dict": {f"module.{k}": v for k, v in upstream.items()}, "epoch_num": 3}, path)


def _supervlad_mapping(upstream: dict[str, torch.Tensor]) -> dict[str, str | None]:
    mapping: dict[str, str | None] = {}
    for key in upstream:
        if key == "backbone.mask_token":
            mapping[key] = None
        elif key.startswith("backbone."):
            mapping[key] = key.replace("backbone.", "backbone.model.", 1)
        else:
            mapping[key] = "head." + key.replace("aggregation.", "", 1)
    return mapping


@pytest.mark.parametrize(("name", "clusters", "encoder", "dim"), [
    ("supervladcross_dinov2_vitb14", 4 + 1, True, 3072),
    ("supervlad1_dinov2_vitb14", 1 + 2, False, 768),
])
def test_supervlad_official(tmp_path: Path, name: str, clusters: int, encoder: bool, dim: int) -> None:
    shapes = prefixed("backbone.", dinov2_hub(DEPTH)) + [("aggregation.conv.weight", (clusters, C, 1, 1))]
    if encoder:
        shapes += cross_image_encoder("encoder.")
    upstream = fill(shapes)
    path = _data_parallel_file(upstream, tmp_path / "SuperVLAD.pth")
    model = aggzoo.create_model(f"{name}.official", checkpoint_path=path, backbone_kwargs=SMALL_VIT)
    transformed = {"backbone.model.pos_embed": upstream["backbone.pos_embed"]}
    assert_placed(model, upstream, _supervlad_mapping(upstream), transformed)
    assert model.out_dim == dim and model.head.batch_dependent == encoder


def test_supervlad_checkpoint_of_the_other_variant_is_refused(tmp_path: Path) -> None:
    # The 1-cluster file (3 assignment rows, no encoder) is not the cross-image model: strict load names it.
    shapes = prefixed("backbone.", dinov2_hub(DEPTH)) + [("aggregation.conv.weight", (3, C, 1, 1))]
    path = _data_parallel_file(fill(shapes), tmp_path / "1-clusterVLAD.pth")
    with pytest.raises(StateDictMismatchError, match="head.encoder.layers.0"):
        aggzoo.create_model("supervladcross_dinov2_vitb14.official", checkpoint_path=path, backbone_kwargs=SMALL_VIT)


def _bn(prefix: str, channels: int) -> Shapes:
    return [(prefix + "weight", (channels,)), (prefix + "bias", (channels,)), (prefix + "running_mean", (channels,)),
            (prefix + "running_var", (channels,)), (prefix + "num_batches_tracked", ())]


def multiconv_adapter(prefix: str, dim: int = C) -> Shapes:
    """Lu-Feng/CricaVPR ``backbone/dinov2/block.py``: ``MulConvAdapter(768, 384, 192, 24, 96, 24, 96)``; Lu-Feng/
    SelaVPRplusplus ``model/adapter.py`` also ``MulConvAdapter(1024, 512, 256, 32, 128, 32, 128)`` (ViT-L)."""
    widths = {768: (384, 192, 24, 96), 1024: (512, 256, 32, 128)}[dim]
    hidden, ch1, red, ch3 = widths
    out: Shapes = [(prefix + "D_fc1.weight", (hidden, dim)), (prefix + "D_fc1.bias", (hidden,))]
    for name, c_in, c_out, k in [("branch1.", hidden, ch1, 1), ("branch2.0.", hidden, red, 1), ("branch2.1.", red, ch3, 3),
                                 ("branch3.0.", hidden, red, 1), ("branch3.1.", red, ch3, 5)]:
        out += [(prefix + name + "conv.weight", (c_out, c_in, k, k)), (prefix + name + "conv.bias", (c_out,))]
        out += _bn(prefix + name + "bn.", c_out)
    return out + [(prefix + "D_fc2.weight", (dim, hidden)), (prefix + "D_fc2.bias", (dim,))]


def test_cricavpr_official(tmp_path: Path) -> None:
    shapes = prefixed("backbone.", dinov2_hub(DEPTH))
    for block in range(DEPTH):
        shapes += multiconv_adapter(f"backbone.blocks.{block}.adapter.")
    shapes += [("aggregation.1.p", (1,))] + cross_image_encoder("encoder.")
    upstream = fill(shapes)
    path = _data_parallel_file(upstream, tmp_path / "CricaVPR.pth")
    model = aggzoo.create_model("cricavpr_dinov2_vitb14.official", checkpoint_path=path,
                                backbone_kwargs={"depth": DEPTH})
    mapping: dict[str, str | None] = {}
    for key in upstream:
        if ".adapter." in key:
            block, rest = key.removeprefix("backbone.blocks.").split(".adapter.")
            mapping[key] = f"backbone.adapters.{block}.{rest}"
        elif key == "backbone.mask_token":
            mapping[key] = None
        elif key.startswith("backbone."):
            mapping[key] = key.replace("backbone.", "backbone.model.", 1)
        else:
            mapping[key] = "head." + key.replace("aggregation.1.", "gem.", 1)
    transformed = {"backbone.model.pos_embed": upstream["backbone.pos_embed"]}
    assert_placed(model, upstream, mapping, transformed)
    assert model.out_dim == 10752 and model.head.batch_dependent


def test_selavpr_official_with_registers(tmp_path: Path) -> None:
    # Lu-Feng/SelaVPR network.py + backbone/dinov2/block.py at ViT-L (C = 1024), --registers.
    dim = 1024
    # dinov2_hub writes ViT-B widths: C, 3C (qkv) and 4C (MLP) become ViT-L's.
    widths = {C: dim, 3 * C: 3 * dim, 4 * C: 4 * dim}
    shapes = [(k, tuple(widths.get(d, d) for d in s)) for k, s in prefixed("backbone.", dinov2_hub(DEPTH, registers=4))]
    for block in range(DEPTH):
        for adapter in ("adapter1", "adapter2"):
            p = f"backbone.blocks.{block}.{adapter}."
            shapes += [(p + "D_fc1.weight", (512, dim)), (p + "D_fc1.bias", (512,)),
                       (p + "D_fc2.weight", (dim, 512)), (p + "D_fc2.bias", (dim,))]
    shapes += [("aggregation.1.p", (1,)), ("LocalAdapt.upconv1.weight", (dim, 256, 3, 3)),
               ("LocalAdapt.upconv1.bias", (256,)), ("LocalAdapt.upconv2.weight", (256, 128, 3, 3)),
               ("LocalAdapt.upconv2.bias", (128,))]
    upstream = fill(shapes)
    path = _data_parallel_file(upstream, tmp_path / "SelaVPR_reg4_msls.pth")
    model = aggzoo.create_model("selavpr_dinov2_vitl14_reg4.official", checkpoint_path=path,
                                backbone_kwargs={"depth": DEPTH})
    mapping: dict[str, str | None] = {}
    for key in upstream:
        if ".adapter" in key:
            block, rest = key.removeprefix("backbone.blocks.").split(".", 1)
            mapping[key] = f"backbone.adapters.{block}.{rest}"
        elif key == "backbone.mask_token":
            mapping[key] = None
        elif key == "backbone.register_tokens":
            mapping[key] = "backbone.model.reg_token"
        elif key.startswith("backbone."):
            mapping[key] = key.replace("backbone.", "backbone.model.", 1)
        else:
            mapping[key] = "head." + key.replace("aggregation.1.", "gem.").replace("LocalAdapt.", "local_adapt.")
    pos = upstream["backbone.pos_embed"]
    # timm's register models keep the class position in the class token (no_embed_class).
    transformed = {"backbone.model.cls_token": upstream["backbone.cls_token"] + pos[:, :1],
                   "backbone.model.pos_embed": pos[:, 1:]}
    assert_placed(model, upstream, mapping, transformed)
    assert model.out_dim == 1024


def _selavprpp_head(dim: int, out_dim: int, *, hashing: bool) -> Shapes:
    # Lu-Feng/SelaVPRplusplus model/network.py (--aggregation gem): linear1, aggregation.1.p, linear2; hashing
    # linear3, aggregation_hashing.1.p, linear4 (-> 512).
    out: Shapes = [("linear1.weight", (dim, dim)), ("linear1.bias", (dim,)), ("aggregation.1.p", (1,)),
                   ("linear2.weight", (out_dim, dim)), ("linear2.bias", (out_dim,))]
    if hashing:
        out += [("linear3.weight", (dim, dim)), ("linear3.bias", (dim,)), ("aggregation_hashing.1.p", (1,)),
                ("linear4.weight", (512, dim)), ("linear4.bias", (512,))]
    return out


_SELAVPRPP_HEAD = {"linear1.": "float_branch.token.", "linear2.": "float_branch.out.", "aggregation.1.p": "float_branch.gem.p",
                   "linear3.": "hash_branch.token.", "linear4.": "hash_branch.out.",
                   "aggregation_hashing.1.p": "hash_branch.gem.p"}


@pytest.mark.parametrize(("arch", "dim", "out_dim", "hashing", "filename"), [
    ("selavprpp_dinov2_vitb14", C, 2048, False, "SelaVPRplusplus_base.pth"),
    ("selavprpp_dinov2_vitb14", C, 2048, True, "SelaVPRplusplus_base_rerank.pth"),
    ("selavprpp_dinov2_vitl14", 1024, 4096, False, "SelaVPRplusplus_large.pth"),
    ("selavprpp_dinov2_vitl14", 1024, 4096, True, "SelaVPRplusplus_large_rerank.pth"),
])
def test_selavprpp_official(tmp_path: Path, arch: str, dim: int, out_dim: int, hashing: bool, filename: str) -> None:
    # The ViT is cut to 2 blocks (ViT-B: side path from block 0, 2 adapters) or 1 (ViT-L, whose side path starts
    # at block 8 upstream: moved to block 0 so that its 1024-wide adapter layout is still tested, upstream adapters.0).
    depth = DEPTH if dim == C else 1
    widths = {C: dim, 3 * C: 3 * dim, 4 * C: 4 * dim}
    shapes = [(k, tuple(widths.get(d, d) for d in s)) for k, s in prefixed("backbone.", dinov2_hub(depth))]
    for path in ("adapters", "adapters_hashing") if hashing else ("adapters",):
        for j in range(depth):
            shapes += multiconv_adapter(f"backbone.{path}.{j}.", dim)
    upstream = fill(shapes + _selavprpp_head(dim, out_dim, hashing=hashing))
    path = _data_parallel_file(upstream, tmp_path / filename)
    tag = "official_rerank" if hashing else "official"
    model = aggzoo.create_model(f"{arch}.{tag}", checkpoint_path=path,
                                backbone_kwargs={"depth": depth, "start_block": 0})
    mapping: dict[str, str | None] = {}
    for key in upstream:
        if key.startswith(("backbone.adapters.", "backbone.adapters_hashing.")):
            mapping[key] = key
        elif key == "backbone.mask_token":
            mapping[key] = None
        elif key.startswith("backbone."):
            mapping[key] = key.replace("backbone.", "backbone.model.", 1)
        else:
            source = next(s for s in _SELAVPRPP_HEAD if key.startswith(s))
            mapping[key] = "head." + _SELAVPRPP_HEAD[source] + key[len(source):]
    transformed = {"backbone.model.pos_embed": upstream["backbone.pos_embed"]}
    assert_placed(model, upstream, mapping, transformed)
    assert model.out_dim == out_dim and model.head.bits == (512 if hashing else 0)
    assert model.pretrained_cfg.input_size == (3, 322, 322)
    if hashing and dim == C:  # a two-branch file is not the float model's: the strict load names the extra keys
        with pytest.raises(StateDictMismatchError, match="adapters_hashing"):
            aggzoo.create_model(f"{arch}.official", checkpoint_path=path, backbone_kwargs={"depth": DEPTH})
