"""The networks, torch and timm only: ``backbones/`` (timm models that return
:class:`~aggzoo.models.features.Features`), ``heads/`` (one aggregation method per file, each
``Features -> [B, D]``), :class:`~aggzoo.models.vpr_model.VPRModel` joining one of each, and the
transforms of a model (``tlc``: test-time local conversion, ``multiscale``: multi-scale descriptors,
``input_size``, ``modes``). It sits above :mod:`aggzoo.layers` and imports no other aggzoo layer
(no Hydra, Lightning or FAISS); :mod:`aggzoo.hub`, :mod:`aggzoo.zoo`, :mod:`aggzoo.evaluation` and
:mod:`aggzoo.training` build on it.
"""

from aggzoo.models.features import Features
from aggzoo.models.vpr_model import VPRModel, build_head

__all__ = ["Features", "VPRModel", "build_head"]
