"""The documentation site: ``mkdocs build --strict`` succeeds (no broken link, no page outside the
navigation, no function or class exported in ``__all__`` without a docstring), and the generated pages
describe the code as it is (every registered name on the zoo pages; the docstring check finds a missing one)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

import aggzoo

REPO = Path(__file__).resolve().parents[1]


def load_gen_pages():
    """``docs/gen_pages.py`` as a module (importing it generates nothing)."""
    spec = importlib.util.spec_from_file_location("aggzoo_docs_gen_pages", REPO / "docs" / "gen_pages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    site = tmp_path / "site"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")])),
               DISABLE_MKDOCS_2_WARNING="true", NO_MKDOCS_2_WARNING="1", NO_ALBUMENTATIONS_UPDATE="1")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=REPO,
                            env=env, capture_output=True, text=True, timeout=900)
    warnings = [line for line in result.stderr.splitlines() if "WARNING" in line or "ERROR" in line]
    assert result.returncode == 0, "\n".join(warnings) or result.stderr[-4000:]
    zoo_index = (site / "zoo" / "index.html").read_text()
    for name in aggzoo.list_models() + aggzoo.list_pretrained():
        assert name in zoo_index, f"{name} is not on the generated zoo page"
    assert (site / "reference" / "aggzoo" / "hub" / "registry" / "index.html").is_file()
    assert "create_model" in (site / "reference" / "aggzoo" / "hub" / "factory" / "index.html").read_text()


def test_zoo_index_lists_every_registered_name() -> None:
    pages = load_gen_pages().zoo_pages(out_dims=False)
    index = pages["zoo/index.md"]
    names = aggzoo.list_models() + aggzoo.list_pretrained()
    assert names and all(f"`{name}`" in index for name in names)
    for cfg in aggzoo.list_pretrained(with_cfg=True):
        page = pages[f"zoo/{sys.modules[aggzoo.hub.registry.model_entrypoint(cfg.architecture).__module__].__name__.rpartition('.')[2]}.md"]
        assert f"### `{cfg.name}`" in page


def test_missing_docstrings_of_exported_names_are_found(tmp_path: Path) -> None:
    package = tmp_path / "aggzoo"
    package.mkdir()
    (package / "__init__.py").write_text('"""A package."""\n')
    (package / "things.py").write_text(
        '"""Things."""\n\n__all__ = ["Documented", "bare", "undocumented_class"]\n\n\n'
        'class Documented:\n    """Has one."""\n\n\n'
        'def bare(x):\n    return x\n\n\n'
        'class undocumented_class:\n    pass\n\n\n'
        'def not_exported():\n    return 1\n')
    found = load_gen_pages().undocumented_exports(tmp_path)
    assert found == ["aggzoo.things.bare", "aggzoo.things.undocumented_class"]


def test_this_checkout_exports_nothing_undocumented() -> None:
    assert load_gen_pages().undocumented_exports() == []


def test_readme_zoo_table_has_every_architecture_with_released_weights() -> None:
    """The README's zoo table (one row per zoo file) names every architecture that loads an authors' release."""
    readme = (REPO / "README.md").read_text()
    table = readme[readme.index("### The zoo"):readme.index("The zoo, one page per method")]
    released = {cfg.architecture for cfg in aggzoo.list_pretrained(with_cfg=True) if cfg.remap is not None}
    assert released and not [a for a in sorted(released) if f"`{a}` (" not in table]
