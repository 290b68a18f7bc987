"""GeM with a learned whitening layer on ResNet-101: filipradenovic/cnnimageretrieval-pytorch's ``*-gem-w`` networks.

F. Radenovic, G. Tolias, O. Chum, "Fine-tuning CNN Image Retrieval with No Human Annotation", TPAMI 2018,
arXiv:1711.02512. Original code: filipradenovic/cnnimageretrieval-pytorch ("cirtorch", MIT).

Upstream facts (cnnimageretrieval-pytorch @ 1e66a41):

- ``cirtorch/networks/imageretrievalnet.py`` ``init_network({'architecture': 'resnet101', 'pooling': 'gem',
  'whitening': True})``: ``features = nn.Sequential(*list(resnet.children())[:-2])`` -> ``features.{0 conv1, 1 bn1,
  4..7 layer1..layer4}.*``; ``pool.p`` [1] (GeM, learned, eps 1e-6); ``whiten`` = Linear(2048, 2048, bias), the
  projection initialised from learned whitening and trained end to end. ``forward``: GeM -> L2 -> whiten -> L2
  (:class:`~aggzoo.models.heads.gem_fc.GeMFC` with ``l2_before_fc=True``).
- ``cirtorch/examples/test_e2e.py``: ``state['state_dict']`` loaded into that network; RGB PIL images, ImageNet
  mean/std, long side 1024 (``imresize``: PIL thumbnail, never enlarged), queries cropped to their box; multi-scale
  ``[1, 2**(1/2), 1/2**(1/2)]`` with the descriptors averaged and L2-normalised (``extract_ms`` with ``msp = 1``;
  each scale by ``F.interpolate(bilinear, align_corners=False)`` without antialiasing, where aggzoo's multi-scale
  antialiases the 1/sqrt(2) scale). No whitening after the network for these models (README: "no need to compute
  whitening as post-processing step").
- The older ``retrievalSfM120k-resnet101-gem`` (no ``whiten`` layer) is evaluated with a learned whitening ``Lw``
  (``meta['Lw']['retrieval-SfM-120k']['ms'|'ss']`` = ``m``, ``P``) applied by ``test.py`` *after* the multi-scale
  aggregation (``whitenapply``: ``P (x - m)``, then L2). Applied inside the network it would act per scale before the
  averaging, which is not what the authors measured: its home is the evaluation's whitening
  (``evaluation.postprocess.whitening``, :class:`~aggzoo.evaluation.postprocess.PCAWhitening` with ``mean = m``,
  ``projection = P^T``), not converted here yet.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from aggzoo.hub.cfg import PretrainedCfg
from aggzoo.hub.registry import register_model
from aggzoo.hub.remap import rename
from aggzoo.models.heads.gem_fc import GeMFC
from aggzoo.zoo._backbones import RESNET101_LAYER4, head, resnet_rules, vpr

__all__ = ["convert_cirtorch_gem_w", "gem_fc_resnet101"]


def convert_cirtorch_gem_w(state: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """``ImageRetrievalNet`` (ResNet, GeM, whitening) keys -> ``gem_fc_resnet101`` keys."""
    rules = resnet_rules("features.", sequential=True) + [
        (r"pool\.p", "head.pool.p"),
        (r"whiten\.(weight|bias)", r"head.fc.\1"),
    ]
    return rename(state, rules, what="cnnimageretrieval-pytorch (ResNet + GeM + whitening)")


_BASE = "http://cmp.felk.cvut.cz/cnnimageretrieval/data/networks"
# tag -> (training set, file, published mAP ROxf M, RPar M, ROxf H, RPar H): the README's "Multi-scale performance of
# all available pre-trained networks" table (test_e2e.py, --multiscale '[1, 2**(1/2), 1/2**(1/2)]').
_RELEASES = {
    "rsfm120k_tl": ("retrieval-SfM-120k", "retrieval-SfM-120k/rSfM120k-tl-resnet101-gem-w-a155e54.pth",
                    67.8, 77.6, 41.7, 56.3),
    "gl18_tl": ("google-landmarks-2018", "gl18/gl18-tl-resnet101-gem-w-a4d43db.pth", 67.3, 80.6, 44.3, 61.5),
}

pretrained_cfgs = {
    f"gem_fc_resnet101.{tag}": PretrainedCfg(
        url=f"{_BASE}/{path}", remap=convert_cirtorch_gem_w,
        input_size=(3, 768, 1024), interpolation="bilinear", out_dim=2048,
        recipe=f"filipradenovic/cnnimageretrieval-pytorch train.py --arch resnet101 --pool gem --whitening "
               f"(triplet loss) on {data}",
        license="MIT (filipradenovic/cnnimageretrieval-pytorch)",
        paper="Fine-tuning CNN Image Retrieval with No Human Annotation (Radenovic et al., TPAMI 2018), arXiv:1711.02512",
        code="https://github.com/filipradenovic/cnnimageretrieval-pytorch",
        metrics={"roxford5k/medium/mAP": oxf_m, "rparis6k/medium/mAP": par_m,
                 "roxford5k/hard/mAP": oxf_h, "rparis6k/hard/mAP": par_h},
        notes="mAP: the README's multi-scale table (test_e2e.py, scales 1, sqrt(2), 1/sqrt(2), long side 1024): "
              "evaluate with preset=revisited evaluation.test_time.scales=[1.0,1.4142,0.7071] "
              "evaluation.test_time.multiscale_interpolation=bilinear evaluation.protocol.multiple=1 (aggzoo "
              "antialiases the 1/sqrt(2) scale, the authors' F.interpolate does not). "
              "The file's sha256 is not pinned (not downloaded here).",
    )
    for tag, (data, path, oxf_m, par_m, oxf_h, par_h) in _RELEASES.items()
}


@register_model
def gem_fc_resnet101(**kwargs: Any) -> nn.Module:
    """GeM + L2 + whitening FC (2048 -> 2048) + L2 on ResNet-101 layer4 (cirtorch's ``-gem-w``): 2048-D."""
    return vpr(RESNET101_LAYER4, head(GeMFC, l2_before_fc=True), **kwargs)
