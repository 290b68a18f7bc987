"""SALAD: optimal-transport aggregation of DINOv2 tokens, with the authors' released weights.

S. Izquierdo, J. Civera, "Optimal Transport Aggregation for Visual Place Recognition", CVPR 2024,
arXiv:2311.15937. Original code: serizba/salad (GPL-3.0: names and shapes only, no code).

Upstream facts of ``dino_salad.ckpt``:

- ``hubconf.py`` builds ``VPRModel(backbone_arch="dinov2_vitb14", agg_arch="SALAD")`` and loads the
  release file with ``model.load_state_dict(...)`` directly: the file is a raw state dict.
- ``vpr_model.py``: the LightningModule holds ``self.backbone`` and ``self.aggregator``.
- ``models/backbones/dinov2.py``: ``self.model = torch.hub.load("facebookresearch/dinov2", ...)``, so
  the backbone keys are ``backbone.model.<DINOv2 hub names>`` (``cls_token``, ``pos_embed``
  [1, 1370, 768], ``mask_token``, ``patch_embed.proj``, ``blocks.{0..11}.*``, ``norm``); the final
  norm is applied (``norm_layer=True``) and the CLS token returned.
- ``models/aggregators/salad.py``: ``token_features`` = Sequential(Linear(768, 512), ReLU,
  Linear(512, 256)) -> indices 0, 2; ``cluster_features`` and ``score`` = Sequential(Conv1x1(768,
  512), Dropout, ReLU, Conv1x1(512, 128 | 64)) -> indices 0, 3; scalar ``dust_bin``.

SALAD-indoor (Enrico-Chiavassa/Indoor-VPR, MIT): ``model/network.py`` ``GeoLocalizationViT`` holds ``self.model =
torch.hub.load("serizba/salad", "dinov2_salad", backbone="dinov2_vitb14")``, so its files are ``dino_salad.ckpt``'s
layout under ``model.``; ``hubconf.py`` loads ``.../Indoor-VPR/releases/download/v0.1.0/salad_Dinov2_8448_
<variation>.pth`` strictly, variation 0 = ``GB1_10_25`` (default), 1 = ``HB1_GB1_2_5``. Its forward resizes every
image to the nearest multiple of 14 per side (antialiased) before SALAD; VPR-methods-evaluation (``salad-indoor``)
does the same resize and no other. The checkpoint reader drops the ``model.`` wrapper
(:func:`aggzoo.hub.checkpoint.unwrap_checkpoint`), so :func:`convert_salad` reads these files as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from aggzoo.hub.cfg import PretrainedCfg
from aggzoo.hub.registry import register_model
from aggzoo.hub.remap import rename
from aggzoo.models.heads.salad import SALAD
from aggzoo.zoo._backbones import DINOV2_EVAL_SIZE, DINOV2_VITB14, adapt_dinov2_embeddings, dinov2_rules, head, vpr
from aggzoo.zoo.eigenplaces import indoor_vpr_cfg

__all__ = ["SALAD_AGGREGATOR_RULES", "convert_salad", "salad_dinov2_vitb14"]

SALAD_AGGREGATOR_RULES = [
    (r"aggregator\.((?:token_features\.[02]|cluster_features\.[03]|score\.[03])\.(?:weight|bias)|dust_bin)",
     r"head.\1"),
]


def convert_salad(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """serizba/salad ``dino_salad.ckpt`` keys -> ``salad_dinov2_vitb14`` keys."""
    out = rename(state, dinov2_rules("backbone.model.") + SALAD_AGGREGATOR_RULES, what="SALAD (serizba/salad)")
    return adapt_dinov2_embeddings(out, model)


pretrained_cfgs = {
    "salad_dinov2_vitb14.official": PretrainedCfg(
        url="https://github.com/serizba/salad/releases/download/v1.0.0/dino_salad.ckpt",
        download_page="https://drive.google.com/file/d/1u83Dmqmm1-uikOPr58IIhfIzDYwFxCy1/view",
        filename="dino_salad.ckpt",
        remap=convert_salad,
        input_size=(3, DINOV2_EVAL_SIZE, DINOV2_EVAL_SIZE), interpolation="bicubic", out_dim=8448,
        recipe="serizba/salad main.py: GSV-Cities, 224x224, 4 epochs, AdamW 6e-5, last 4 DINOv2 blocks trained",
        license="GPL-3.0 (serizba/salad)",
        paper="Optimal Transport Aggregation for Visual Place Recognition (Izquierdo & Civera, CVPR 2024), "
              "arXiv:2311.15937",
        code="https://github.com/serizba/salad",
        metrics={"msls_val/R@1": 92.2, "msls_challenge/R@1": 75.0, "nordland_1frame/R@1": 76.0, "sped/R@1": 92.1},
        notes="Evaluated at 322x322 (README eval.py --image_size 322 322).",
    ),
    # SALAD-CM: the same architecture trained with clique mining (aggzoo.training.clique_mining)
    "salad_dinov2_vitb14.cliquemining": PretrainedCfg(
        download_page="https://drive.google.com/file/d/1B06ysb-Wjb4KDcNrl-7pyj1mJve1jqdk/view",
        filename="cliquemining.ckpt",  # VPR-methods-evaluation's name for it (the Drive file's own: not found)
        remap=convert_salad,
        input_size=(3, DINOV2_EVAL_SIZE, DINOV2_EVAL_SIZE), interpolation="bicubic", out_dim=8448,
        recipe="serizba/cliquemining main.py: each step a GSV-Cities batch (30 places x 4, 224) plus a clique batch "
               "from MSLS train (30 x 4, cliques under 25 m), MS loss per half; AdamW 6e-5, 4 epochs, last 4 blocks",
        license="GPL-3.0 (serizba/cliquemining)",
        paper="Close, But Not There: Boosting Geographic Distance Sensitivity in Visual Place Recognition "
              "(Izquierdo & Civera, ECCV 2024), arXiv:2407.02422",
        code="https://github.com/serizba/cliquemining",
        metrics={"pitts30k_test/R@1": 92.7, "msls_val/R@1": 94.2, "msls_challenge/R@1": 82.7, "tokyo247/R@1": 96.8,
                 "nordland_10frames/R@1": 96.0},
        notes="A Lightning checkpoint {'state_dict'} with serizba/salad's keys (backbone.model., aggregator.): the "
              "SALAD converter reads it (VPR-methods-evaluation loads it strictly into the hub dinov2_salad). Figures: "
              "ImAge's comparison table (Nordland: the +-10-frame protocol). Upstream's Sinkhorn helper is the "
              "SuperGlue form with the same marginals and 3 iterations (inferred equivalent: not checked here).",
    ),
}

# Indoor-VPR hubconf AVAILABLE_VARIATIONS["salad_Dinov2_8448"]; the default variation gets the plain tag.
for _tag, _variation in (("indoor", (0, "GB1_10_25")), ("indoor_hb1_gb1_2_5", (1, "HB1_GB1_2_5"))):
    pretrained_cfgs[f"salad_dinov2_vitb14.{_tag}"] = indoor_vpr_cfg(
        "salad_Dinov2_8448", _variation, remap=convert_salad, method="SALAD (DINOv2 ViT-B/14, 8448-D)",
        input_size=(3, DINOV2_EVAL_SIZE, DINOV2_EVAL_SIZE), interpolation="bicubic", out_dim=8448,
        paper="Optimal Transport Aggregation for Visual Place Recognition (Izquierdo & Civera, CVPR 2024), "
              "arXiv:2311.15937 (the architecture; the indoor fine-tuning has no paper)",
        notes="Upstream resizes each image to the nearest multiple of 14 per side (its forward; VPR-methods-evaluation "
              "passes native-size images): the 322x322 here is the zoo's DINOv2 default, not a published protocol. "
              "The file is dino_salad.ckpt's state dict under model. (Indoor-VPR wraps the torch.hub SALAD model); the "
              "checkpoint reader drops that prefix.",
    )


@register_model
def salad_dinov2_vitb14(**kwargs: Any) -> nn.Module:
    """SALAD (m = 64 clusters of l = 128, g = 256) on DINOv2 ViT-B/14 with its final norm: 8448-D."""
    return vpr(DINOV2_VITB14, head(SALAD), **kwargs)
