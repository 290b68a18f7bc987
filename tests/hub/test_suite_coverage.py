"""Every method of the community's evaluation suite (gmberton/VPR-methods-evaluation, ``parser.py``'s
``--method`` choices, April 2026) resolves to an aggzoo model of the same descriptor size.

The table maps the suite's method name (with its default ``--backbone`` / ``--descriptors_dimension``
from ``parser.py``) to the aggzoo name that loads the same released weights. Each row builds the model on
the meta device (no weights, no memory) through ``aggzoo.create_model``: a method that goes missing from
the registry, or whose descriptor size drifts from the suite's, fails here.
"""

from __future__ import annotations

import pytest
import torch

import aggzoo
from aggzoo.hub.factory import get_pretrained_cfg

# suite method -> (aggzoo <arch>.<tag>, the suite's default descriptors_dimension)
SUITE_METHODS: dict[str, tuple[str, int]] = {
    "netvlad": ("netvlad_vgg16.pitts30k", 4096),
    "apgem": ("apgem_resnet101.official", 2048),
    "sfrs": ("sfrs_vgg16.official", 4096),
    "cosplace": ("cosplace_resnet50.official", 2048),
    "convap": ("convap_resnet50.official_8192", 8192),
    "mixvpr": ("mixvpr_resnet50.official", 4096),
    "eigenplaces": ("eigenplaces_resnet50.official", 2048),
    "eigenplaces-indoor": ("eigenplaces_resnet50.indoor", 2048),
    "anyloc-urban": ("anyloc_dinov2_vitg14.urban", 49152),
    "anyloc-indoor": ("anyloc_dinov2_vitg14.indoor", 49152),
    "anyloc-aerial": ("anyloc_dinov2_vitg14.aerial", 49152),
    "anyloc-structured": ("anyloc_dinov2_vitg14.structured", 49152),
    "anyloc-unstructured": ("anyloc_dinov2_vitg14.unstructured", 49152),
    "anyloc-global": ("anyloc_dinov2_vitg14.global", 49152),
    "salad": ("salad_dinov2_vitb14.official", 8448),
    "salad-indoor": ("salad_dinov2_vitb14.indoor", 8448),
    "cricavpr": ("cricavpr_dinov2_vitb14.official", 10752),
    "clique-mining": ("salad_dinov2_vitb14.cliquemining", 8448),
    "megaloc": ("megaloc_dinov2_vitb14.official", 8448),
    "boq": ("boq_resnet50.official", 16384),
    "dinomix": ("dinomix_dinov2_vitb14.official", 4096),
    "edtformer": ("edtformer_dinov2_vitb14.official", 4096),
    "supervlad": ("supervlad_dinov2_vitb14.official", 3072),
    "supervlad-crossim": ("supervladcross_dinov2_vitb14.official", 3072),
    "qaa": ("qaa_dinov2_vitb14.official", 8192),
}

# The two 2025-2026 records the suite does not run yet (issue 22): SAGE and FoL, by their released weights.
FRONTIER_METHODS: dict[str, tuple[str, int]] = {
    "sage": ("sagecross_dinov2_vitl14.official", 8448),
    "fol": ("fol_dinov2_vitl14.official", 8448),
}


@pytest.mark.parametrize("method", sorted(SUITE_METHODS | FRONTIER_METHODS))
def test_every_suite_method_resolves_to_released_weights(method: str) -> None:
    name, dim = (SUITE_METHODS | FRONTIER_METHODS)[method]
    cfg = get_pretrained_cfg(name)
    assert cfg.out_dim == dim, f"{method}: the suite's {dim}-D, the cfg's {cfg.out_dim}-D"
    assert cfg.source != "(no weights)" and cfg.remap is not None, f"{method}: {name} loads no released file"
    with torch.device("meta"):  # the architecture, without allocating or downloading anything
        model = aggzoo.create_model(name)
    assert model.out_dim == dim, f"{method}: {name} builds a {model.out_dim}-D model"
    assert next(model.parameters()).device.type == "meta"


def test_the_table_names_distinct_weights() -> None:
    names = [name for name, _ in (SUITE_METHODS | FRONTIER_METHODS).values()]
    assert len(SUITE_METHODS) == 25 and len(set(names)) == len(names)
