"""VGG cut at its last convolution *before* that convolution's ReLU: NetVLAD's ``conv5_3`` crop.

NetVLAD (Arandjelovic et al., CVPR 2016, arXiv:1511.07247, section 5: "VGG-16 cropped at the last
convolutional layer (conv5), before ReLU") and the models built on its released network (the SFRS
release of yxgeee/OpenIBL, the MATLAB weights that gmberton/VPR-methods-evaluation loads) read the raw
``conv5_3`` responses, which can be negative. timm's ``vgg16`` returns each level after its ReLU
(``features.29`` for conv5), so this backbone replaces the last returned level's ReLU by an identity;
every parameter keeps timm's (= torchvision's) name ``model.features.<i>.{weight,bias}``.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from aggzoo.models.backbones.timm_backbone import TimmBackbone

__all__ = ["PreActivationVGG"]


class PreActivationVGG(TimmBackbone):
    """A timm VGG (``vgg16``, ...) whose deepest returned map is taken before its final ReLU.

    Args are :class:`TimmBackbone`'s (``out_indices=(4,)`` is conv5, 512 channels, stride 16).

    Shapes: ``x: [B, 3, H, W] -> Features(maps=([B, 512, H/16, W/16],))`` for ``out_indices=(4,)``.
    """

    def __init__(self, model_name: str = "vgg16", **kwargs: Any) -> None:
        super().__init__(model_name, **kwargs)
        last = self.feature_info[-1]["module"]  # "features.29": the ReLU that ends conv5
        if not isinstance(self.model.get_submodule(last), nn.ReLU):
            raise ValueError(f"{model_name}: level {last!r} does not end with a ReLU; PreActivationVGG is for timm VGGs")
        self.model.features[int(last.rpartition(".")[2])] = nn.Identity()
