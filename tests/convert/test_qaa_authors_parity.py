"""QAA against the authors' code: a fixture made outside this repository from arplaboratory/QAA's ``qaa.py``
(scores normalised by optimal transport with a dustbin) and from gmberton/VPR-methods-evaluation's port (no
normalisation), at tiny sizes with random weights: their state dicts, one input and their outputs
(fixtures/qaa_authors_tiny.safetensors, its metadata names the sources). Our head, loaded with their weights and
the matching ``sinkhorn`` switch, gives their outputs; with the other switch it does not.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from aggzoo.models.features import Features
from aggzoo.models.heads.qaa import QAA

FIXTURE = Path(__file__).with_name("fixtures") / "qaa_authors_tiny.safetensors"
SIZES = {"num_clusters": 4, "cluster_dim": 8, "num_queries": 10, "feature_heads": 2, "score_heads": 4}


def _ours(stored: dict[str, torch.Tensor], source: str, sinkhorn: bool) -> QAA:
    head = QAA(32, sinkhorn=sinkhorn, **SIZES).eval()
    state = {k.removeprefix(source + "."): v for k, v in stored.items() if k.startswith(source + ".")}
    unused = {"score.norm2_out.weight", "score.norm2_out.bias"} | (set() if sinkhorn else {"dust_bin"})
    head.load_state_dict({k: v for k, v in state.items() if k not in unused})
    return head


@pytest.mark.parametrize("source, sinkhorn", [("sinkhorn", True), ("port", False)])
def test_our_head_gives_the_authors_outputs(source: str, sinkhorn: bool) -> None:
    stored = load_file(FIXTURE)
    with safe_open(FIXTURE, "pt") as f:
        assert "arplaboratory/QAA" in f.metadata()["source"]
    feats = Features(maps=(stored["input"],))
    expected = stored[f"out_{source}"]
    with torch.no_grad():
        torch.testing.assert_close(_ours(stored, source, sinkhorn)(feats), expected, atol=1e-6, rtol=0)
        assert (_ours(stored, source, not sinkhorn)(feats) - expected).abs().max() > 1e-2
