"""AP-GeM: ResNet-101 + GeM + FC trained with a listwise average-precision loss, with the authors' weights.

J. Revaud, J. Almazan, R. S. Rezende, C. R. de Souza, "Learning with Average Precision: Training Image
Retrieval with a Listwise Loss", ICCV 2019, arXiv:1906.07589. Original code: naver/deep-image-retrieval
(BSD-3-Clause, ``LICENSE``: "Copyright (c) 2019, NAVER LABS"). Head: :class:`~aggzoo.models.heads.apgem.APGeM`.

Upstream facts (naver/deep-image-retrieval @ 610247f; gmberton/VPR-methods-evaluation @ adbb6e2
``vpr_models/apgem.py``, method ``apgem``: ResNet-101, 2048-D):

- The suite loads ``Resnet-101-AP-GeM.pt`` (Google Drive ``1UWJGDuHtzaQdFhSMojoYVQjmCXhIwVvy``, the README row
  "Resnet101-AP-GeM") with dirtorch's ``load_model`` and whitens with ``whiten_name="Landmarks_clean"``,
  ``whitenp=0.25``, ``whitenv=None``, ``whitenm=1.0``.
- The file (``dirtorch/extract_features.py`` ``load_model``, ``utils/common.py`` ``load_checkpoint``) is a
  ``torch.save`` dict: ``model_options`` (the ``create_model`` arguments), ``state_dict`` (``module.`` stripped
  on load), ``preprocess``, ``pca`` (name -> a fitted ``sklearn.decomposition.PCA``).
- ``nets/rmac_resnet.py`` ``resnet101_rmac`` -> ``ResNet_RMAC``: torchvision-named ResNet-101 (``conv1``,
  ``bn1``, ``layer1..4``; ``fc_out=0`` so no classifier), ``adpool = GeneralizedMeanPoolingP(norm=3)``
  (``adpool.p [1]``; ``clamp(eps=1e-6)^p``, average, ``^(1/p)``), optional L2 (``norm_features``, default
  False), ``fc = Linear(2048, out_dim=2048)``, L2.
- ``utils/common.py`` ``whiten_features``/``transform`` (sklearn path): ``(x - mean_) @ components_[:whitenv].T``,
  divided by ``whitenm * explained_variance_ ** whitenp`` when the PCA was fitted with ``whiten=True``, then L2.
  That is ``P (x - m)`` with ``P = diag(whitenm * lambda^whitenp)^-1 U``: an
  :class:`~aggzoo.layers.whitening.AffineWhitening` inside the model (the suite runs it per image on the CPU).
- Preprocessing: ``preprocess`` defaults to ImageNet mean/std; the suite feeds its ImageNet-normalised
  images at their own size.

What this converter reads: ``state_dict`` keys as stored (``module.`` removed by the loader) plus the PCA
named ``Landmarks_clean`` as ``pca.Landmarks_clean.{mean_, components_, explained_variance_, whiten}``
tensors. The released ``.pt`` pickles the PCA as a scikit-learn object; aggzoo's reader keeps its fields as
data without importing scikit-learn (:class:`aggzoo.hub.checkpoint.PickledEstimator`) and hands them over
under those names.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from aggzoo.errors import ConversionError
from aggzoo.hub.cfg import PretrainedCfg
from aggzoo.hub.registry import register_model
from aggzoo.hub.remap import rename
from aggzoo.layers.whitening import pca_whitening_projection
from aggzoo.models.heads.apgem import APGeM
from aggzoo.zoo._backbones import RESNET101_LAYER4, head, resnet_rules, vpr

__all__ = ["WHITEN_MULTIPLIER", "WHITEN_POWER", "apgem_resnet101", "convert_apgem"]

_PCA = "pca.Landmarks_clean."


#: dirtorch ``whiten_features`` arguments the suite passes: ``whitenp`` and ``whitenm`` (``whitenv=None``:
#: all components kept)
WHITEN_POWER = 0.25
WHITEN_MULTIPLIER = 1.0


def convert_apgem(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """dirtorch ``ResNet_RMAC`` keys (+ the ``Landmarks_clean`` PCA fields) -> ``apgem_resnet101`` keys.

    The PCA becomes ``head.whiten.{weight, bias}`` (``P``, ``-P m``); it is dropped for a model built with
    ``whiten=False``."""
    pca = {key[len(_PCA):]: value for key, value in state.items() if key.startswith(_PCA)}
    rules = resnet_rules("", sequential=False) + [
        (r"adpool\.p", "head.gem.pool.p"),
        (r"fc\.(weight|bias)", r"head.fc.\1"),
        (re.escape(_PCA) + r"(mean_|components_|explained_variance_|whiten)", None),
    ]
    out = rename(state, rules, what="AP-GeM (naver/deep-image-retrieval ResNet_RMAC)")
    whitening = getattr(model.get_submodule("head"), "whiten", None)
    if whitening is None:
        return out
    missing = [name for name in ("mean_", "components_", "whiten") if name not in pca]
    if missing:
        raise ConversionError(
            f"AP-GeM: the checkpoint has no {', '.join(_PCA + m for m in missing)}: the whitening learned on "
            "Landmarks-clean is part of the released model (build with whiten=False to load without it)")
    variance = pca.get("explained_variance_") if bool(pca["whiten"]) else None
    if variance is None and bool(pca["whiten"]):
        raise ConversionError(f"AP-GeM: the PCA whitens but the checkpoint has no {_PCA}explained_variance_")
    projection = pca_whitening_projection(pca["components_"], variance, power=WHITEN_POWER, multiplier=WHITEN_MULTIPLIER)
    mean = pca["mean_"].double()
    out["head.whiten.weight"] = projection.float()
    out["head.whiten.bias"] = (-(projection @ mean)).float()
    return out


pretrained_cfgs = {
    "apgem_resnet101.official": PretrainedCfg(
        download_page="https://drive.google.com/open?id=1UWJGDuHtzaQdFhSMojoYVQjmCXhIwVvy",
        filename="Resnet-101-AP-GeM.pt",
        remap=convert_apgem,
        input_size=(3, 480, 640), interpolation="bilinear", out_dim=2048,
        recipe="naver/deep-image-retrieval Resnet101-AP-GeM (AP loss on Landmarks-clean), whitening "
               "Landmarks_clean, whitenp 0.25, as gmberton/VPR-methods-evaluation --method apgem loads it",
        license="BSD-3-Clause (naver/deep-image-retrieval)",
        paper="Learning with Average Precision: Training Image Retrieval with a Listwise Loss "
              "(Revaud et al., ICCV 2019), arXiv:1906.07589",
        code="https://github.com/naver/deep-image-retrieval",
        metrics={"roxford5k/medium/mAP": 67.1, "roxford5k/hard/mAP": 42.3,
                 "rparis6k/medium/mAP": 80.3, "rparis6k/hard/mAP": 60.9},
        notes="Figures: naver/deep-image-retrieval README, 'Pre-trained models' table, row Resnet101-AP-GeM "
              "(single resolution, whitening learned on Landmarks-clean; revisited: medium / hard; original Oxford5K 89.1, "
              "Paris6K 93.0 mAP). The Drive file is a zip holding Resnet-101-AP-GeM.pt: place the .pt. "
              "VPR-methods-evaluation evaluates at the images' own size (480x640 for its datasets).",
    ),
}


@register_model
def apgem_resnet101(**kwargs: Any) -> nn.Module:
    """AP-GeM on ResNet-101 layer4: GeM -> FC 2048 -> L2 -> PCA-whitening -> L2, 2048-D."""
    return vpr(RESNET101_LAYER4, head(APGeM), **kwargs)
