"""SuperGlobal's test-time changes to a trained GeM model: its pooling and its ReLU floor.

S. Shao, K. Chen, A. Karpur, Q. Cui, A. Araujo, B. Cao, "Global Features are All You Need for Image Retrieval
and Reranking", ICCV 2023, arXiv:2308.06954; ShihaoShao-GH/SuperGlobal (MIT), re-implemented from its code
(``model/resnet.py``, ``modules/coarse_retrieval/{gemp,rgem,relup}.py``), run there on CVNet's ResNets with every
option on (``SupG.gemp SupG.rgem SupG.sgem SupG.relup SupG.rerank``, its README's command for the published
figures):

- pooling (``gemp`` + ``rgem``): the head's learned GeM is replaced by regional GeM (p 2.5, 5x5), GeM+ (p fixed at
  4.6, eps 1e-8) and L2; on CVNet's head the projection then reads that L2-normalised vector. The head says how
  (``with_superglobal_pooling()``: :class:`~aggzoo.models.heads.gem.GeM`, :class:`~aggzoo.models.heads.gem_fc.GeMFC`).
- ReLU+ (``relup``): in the ResNet, the ReLUs of the first stage's bottleneck branches and the block outputs of
  stages 1-3 become ``max(x, 0.014)``; the stem's and the last stage's stay ReLUs (as the authors' ``ResStage`` /
  ``BottleneckTransform`` build them: the branch floor is tied to ``w_out == 256``, the block one to ``w_out != 2048``).
- scale-GeM (``sgem``) and the re-ranking are not model changes: :class:`aggzoo.models.multiscale.MultiScale`
  (``reduce="max"``, bilinear) and :class:`aggzoo.evaluation.postprocess.SuperGlobalRerank`.

Nothing here changes a weight: the converted copy computes SuperGlobal's descriptor from the same state dict.
"""

from __future__ import annotations

import copy

from torch import Tensor, nn

from aggzoo.errors import ConfigError

__all__ = ["RELU_FLOOR", "ReLUFloor", "superglobal_model"]

#: the floor of SuperGlobal's ReLU+ (``relup(0.014)``)
RELU_FLOOR = 0.014


class ReLUFloor(nn.Module):
    """``max(x, floor)``: SuperGlobal's ReLU+ (the ReLU is ``floor = 0``). Shapes unchanged."""

    def __init__(self, floor: float = RELU_FLOOR) -> None:
        super().__init__()
        self.floor = float(floor)

    def forward(self, x: Tensor) -> Tensor:
        return x.clamp(min=self.floor)

    def extra_repr(self) -> str:
        return f"floor={self.floor}"


def _floor_resnet_relus(resnet: nn.Module, floor: float) -> None:
    """ReLU+ in a timm / torchvision ResNet of bottlenecks (``layer1..4``, blocks with ``act1..3``)."""
    for stage in (1, 2, 3):
        for block in getattr(resnet, f"layer{stage}"):
            names = ("act1", "act2", "act3") if stage == 1 else ("act3",)
            for name in names:
                if not isinstance(getattr(block, name, None), nn.ReLU):
                    raise ConfigError(f"SuperGlobal's ReLU+ needs a ResNet of bottleneck blocks (act1..act3 ReLUs); "
                                      f"layer{stage} has a {type(block).__name__}: use evaluation.test_time.relu_floor=null")
                setattr(block, name, ReLUFloor(floor))


def superglobal_model(model: nn.Module, *, relu_floor: float | None = RELU_FLOOR) -> nn.Module:
    """A copy of ``model`` (a VPRModel: ``backbone`` + ``head``) with SuperGlobal's pooling, and its ReLU+ at
    ``relu_floor`` in a ResNet backbone (``None``: the backbone unchanged).

    Raises:
        ConfigError: the head has no SuperGlobal pooling (only GeM heads do), or ReLU+ was asked of a backbone that
            is not a ResNet of bottlenecks.
    """
    head = getattr(model, "head", None)
    swap = getattr(head, "with_superglobal_pooling", None)
    if swap is None:
        raise ConfigError(f"evaluation.test_time.pooling=superglobal replaces a GeM pooling; the {type(head).__name__} "
                          "head has none (GeM heads: gem, gem_fc, e.g. model=cvnet_resnet50.official)")
    # The PretrainedCfg (frozen, holding read-only mappings deepcopy cannot copy) is shared, not copied.
    cfg = getattr(model, "pretrained_cfg", None)
    converted = copy.deepcopy(model, memo={id(cfg): cfg} if cfg is not None else None)
    converted.head = swap()
    if relu_floor is not None:
        resnet = getattr(getattr(converted, "backbone", None), "model", None)
        if resnet is None or not hasattr(resnet, "layer1"):
            raise ConfigError("SuperGlobal's ReLU+ (evaluation.test_time.relu_floor) applies to ResNet backbones; "
                              f"this model's backbone is {type(getattr(converted, 'backbone', None)).__name__}: "
                              "set evaluation.test_time.relu_floor=null")
        _floor_resnet_relus(resnet, relu_floor)
    return converted
