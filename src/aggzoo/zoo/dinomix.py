"""DINO-Mix: MixVPR's feature mixing on DINOv2 ViT-B/14 patch tokens, with the authors' weights.

G. Huang, Y. Zhou, X. Hu, C. Zhang, L. Zhao, W. Gan, "DINO-Mix: Enhancing Visual Place Recognition with
Foundational Vision Model and Feature Mixing", Scientific Reports 14, 22100 (2024), arXiv:2311.00230.
Original code: GaoShuang98/DINO-Mix (MIT). The head is MixVPR's
(:class:`~aggzoo.models.heads.mixvpr.MixVPR`) at other settings, so this method has a zoo file and no
model file or head config of its own.

Upstream facts (GaoShuang98/DINO-Mix ``hubconf.py``, ``models/backbones/DINOv2_self.py``,
``models/aggregators/mixvpr.py``; the same in gmberton/VPR-methods-evaluation ``vpr_models/dinomix.py``):

- backbone: the torch.hub ``dinov2_vitb14``; ``patch_embed`` and blocks ``0..layer1`` frozen with
  ``layer1 = 7``, so blocks 8-11 are fine-tuned; ``norm`` and ``head`` replaced by empty
  ``nn.Sequential``: the patch tokens are the raw output of the last block, without the final LayerNorm,
  and the CLS token is dropped (``use_cls=False``).
- aggregator: MixVPR with ``in_channels=768, in_h=16, in_w=16, out_channels=1024, mix_depth=2,
  mlp_ratio=1, out_rows=4`` -> 1024 x 4 = 4096-D; the 16 x 16 map bakes in 224 x 224 inputs (README:
  "images must be resized to 224x224"; VPR-methods-evaluation's parser sets ``--image_size 224 224``).
- release: ``https://github.com/GaoShuang98/DINO-Mix/releases/download/v1.0.0/dinov2_vitb14_mix.ckpt``,
  a dict whose ``state_dict`` is loaded strictly: ``backbone.dino_model.<DINOv2 hub names>`` (with
  ``mask_token``, without ``norm.*``) and ``aggregator.{mix.{0,1}.mix.{0,1,3}, channel_proj, row_proj}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from aggzoo.hub.cfg import PretrainedCfg
from aggzoo.hub.registry import register_model
from aggzoo.hub.remap import rename
from aggzoo.models.heads.mixvpr import MixVPR
from aggzoo.zoo._backbones import DINOV2_VITB14, adapt_dinov2_embeddings, dinov2_rules, head, vpr
from aggzoo.zoo.mixvpr import MIXVPR_AGGREGATOR_RULES

__all__ = ["convert_dinomix", "dinomix_dinov2_vitb14"]

#: DINO-Mix's fixed input size: 16 x 16 patches of 14 px.
DINOMIX_SIZE = 224

# DINOv2 ViT-B/14 without the final norm, patch embedding and blocks 0-7 frozen, built for 224 x 224.
_DINOV2_VITB14_224_BLOCKS = dict(DINOV2_VITB14, img_size=DINOMIX_SIZE, final_norm=False)
# MixVPR with 2 mixers over 16 x 16 positions; its defaults give the rest (out_channels 1024, out_rows 4, mlp_ratio 1).
_MIX = head(MixVPR, in_h=DINOMIX_SIZE // 14, in_w=DINOMIX_SIZE // 14, mix_depth=2)


def convert_dinomix(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """``dinov2_vitb14_mix.ckpt`` keys -> ``dinomix_dinov2_vitb14`` keys."""
    out = rename(state, dinov2_rules("backbone.dino_model.") + MIXVPR_AGGREGATOR_RULES,
                 what="DINO-Mix (GaoShuang98/DINO-Mix)")
    return adapt_dinov2_embeddings(out, model)


pretrained_cfgs = {
    "dinomix_dinov2_vitb14.official": PretrainedCfg(
        url="https://github.com/GaoShuang98/DINO-Mix/releases/download/v1.0.0/dinov2_vitb14_mix.ckpt",
        download_page="https://drive.google.com/file/d/1-hcV5UvOLK-ZQIvWWz8qDke_FLQB6mc5/view",
        filename="dinov2_vitb14_mix.ckpt",
        remap=convert_dinomix,
        input_size=(3, DINOMIX_SIZE, DINOMIX_SIZE), interpolation="bilinear", out_dim=4096,
        recipe="GaoShuang98/DINO-Mix main.py: GSV-Cities; DINOv2 ViT-B/14 with blocks 8-11 fine-tuned, MixVPR "
               "(2 mixers over 16 x 16 positions, d = 1024, R = 4), 224 x 224",
        license="MIT (GaoShuang98/DINO-Mix)",
        paper="DINO-Mix: Enhancing Visual Place Recognition with Foundational Vision Model and Feature Mixing "
              "(Huang et al., Scientific Reports 2024), arXiv:2311.00230",
        code="https://github.com/GaoShuang98/DINO-Mix",
        # the authors' README table "Trained models of DINO-Mix", row ViTb14-Mix
        metrics={"pitts30k_val/R@1": 94.37, "pitts30k_test/R@1": 92.03},
        notes="Inputs must be exactly 224x224 (README; VPR-methods-evaluation --image_size 224 224). The release "
              "file is {'state_dict': ...} without the final norm (replaced by an identity upstream).",
    ),
}


@register_model
def dinomix_dinov2_vitb14(**kwargs: Any) -> nn.Module:
    """DINO-Mix (Huang et al., 2024): MixVPR on DINOv2 ViT-B/14 tokens without the final norm, 224 x 224: 4096-D.

    2 mixers over the 16 x 16 positions, d = 1024, R = 4; inputs must be 224 x 224."""
    return vpr(_DINOV2_VITB14_224_BLOCKS, _MIX, **kwargs)
