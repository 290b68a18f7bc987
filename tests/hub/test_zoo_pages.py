"""A method that is registered gets its generated zoo page (docs/gen_pages.py), with what its
PretrainedCfg says: paper, licence, code, D, input size and protocol, converter, figures, recipe."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from hub_helpers import TINY_NAME
from test_docs import load_gen_pages

from aggzoo.hub import registry
from aggzoo.hub.cfg import PretrainedCfg

REPO = Path(__file__).resolve().parents[2]


def convert_dummy(state: Mapping[str, torch.Tensor], model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A stand-in converter (never called here)."""
    return dict(state)


def test_a_registered_method_gets_its_page(tiny_registered: str) -> None:
    gen_pages = load_gen_pages()
    before = gen_pages.zoo_pages(out_dims=False)
    registry.register_pretrained(f"{TINY_NAME}.dummy", PretrainedCfg(
        url="https://example.org/dummy.pth", remap=convert_dummy, input_size=(3, 96, 128), out_dim=17,
        paper="A Dummy Aggregation (Nobody, 2026), arXiv:0000.00000", license="MIT (example/dummy)",
        code="https://example.org/dummy", recipe="python train.py head=gem trainer.max_epochs=1",
        metrics={"dummy_bench/R@1": 12.5}))
    pages = gen_pages.zoo_pages(out_dims=True)
    page = pages["zoo/hub_helpers.md"]  # the module that registered it
    assert "zoo/hub_helpers.md" not in before or f"{TINY_NAME}.dummy" not in before["zoo/hub_helpers.md"]
    for text in (f"## `{TINY_NAME}`", f"### `{TINY_NAME}.dummy`", "A Dummy Aggregation (Nobody, 2026)", "MIT (example/dummy)",
                 "https://example.org/dummy", "https://example.org/dummy.pth", "96x128",
                 f"`{convert_dummy.__module__}.convert_dummy`", "python train.py head=gem trainer.max_epochs=1",
                 "| `dummy_bench/R@1` | 12.5 |", "| descriptor size D | 17 |"):
        assert text in page, f"{text!r} not on the generated page:\n{page}"
    built_dim = registry.model_entrypoint(TINY_NAME)().out_dim
    assert f"D = {built_dim}" in page  # the architecture's own size, read by building it
    assert f"`{TINY_NAME}.dummy`" in pages["zoo/index.md"] and "[hub_helpers](hub_helpers.md)" in pages["zoo/index.md"]
