"""Installable anywhere: the wheel carries the configs and the shipped weights, and its console scripts
run from an empty folder outside the checkout.

The wheel is built from a copy of the checkout's sources (setuptools' in-tree ``build/`` folder could
otherwise carry stale files into it) and installed with ``--no-deps`` into a fresh virtual
environment outside the checkout, which reuses this interpreter's installed dependencies through a
``.pth`` file (torch and friends are not installed twice) but not its aggzoo. Then ``aggzoo-train``
runs a tiny job in an empty folder: its run folder must be written there, and the synthetic city
generated into the user cache (``~/.cache/aggzoo``), not inside site-packages.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import matplotlib
import pytest

from aggzoo.hub.checkpoint import sha256_of
from aggzoo.hub.download import weights_dir

REPO = Path(__file__).resolve().parents[1]
#: a seconds-sized default job: the tiny synthetic city, a tiny random backbone, one epoch
TINY = ["synthetic=tiny", "backbone=test_resnet", "head=gem", "data.image_size=[48,64]", "data.eval_image_size=[48,64]",
        "data.places_per_batch=4", "trainer.max_epochs=1", "logger=csv_only", "evaluate_baseline=false",
        "callbacks.progress_bar.refresh_rate=0", "trainer.limit_train_batches=2", "check_images=none"]

pytestmark = pytest.mark.slow


def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, **kwargs)
    assert result.returncode == 0, f"{command}\n--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-5000:]}"
    return result


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with the wheel built from this checkout installed (``--no-deps``)."""
    pytest.importorskip("setuptools.build_meta", reason="building the wheel offline needs setuptools installed")
    root = tmp_path_factory.mktemp("install")
    sources = root / "sources"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc")
    sources.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, sources / name)
    for name in ("src", "conf", "weights"):  # src/aggzoo/conf and src/aggzoo/weights are links to these two
        shutil.copytree(REPO / name, sources / name, symlinks=True, ignore=ignore)
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(root / "dist"),
          str(sources)])
    (wheel,) = (root / "dist").glob("aggzoo-*.whl")
    env_dir = root / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)])
    (purelib,) = (env_dir / "lib").glob("python*/site-packages")
    # This interpreter's dependencies (lines of a .pth are appended to sys.path after the venv's own
    # site-packages; the .pth files inside them, such as the checkout's editable install, are not run).
    (purelib / "_reuse_dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    _run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--ignore-installed",
          str(wheel)], env=_clean_env(root))
    return env_dir


def _clean_env(root: Path) -> dict[str, str]:
    """No checkout on the path, no aggzoo setting, a fresh home (so the user cache is ``<home>/.cache``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGGZOO_", "PYTHON", "HF_"))}
    env.update(HOME=str(root / "home"), AGGZOO_OFFLINE="1", HF_HUB_OFFLINE="1", NO_ALBUMENTATIONS_UPDATE="1",
               MPLCONFIGDIR=matplotlib.get_configdir())  # matplotlib's font cache, not rebuilt in the fresh home
    env.pop("XDG_CACHE_HOME", None)
    return env


def test_the_wheel_carries_every_module_config_and_shipped_weight(venv: Path) -> None:
    """``pip install aggzoo`` (not editable) must find its configs and weights: the package links conf/
    and weights/ in, package-data puts the files in the wheel, and they are installed byte for byte."""
    assert weights_dir().resolve() == (REPO / "weights").resolve()  # in a checkout: the repository's folder
    (package,) = (venv / "lib").glob("python*/site-packages/aggzoo")
    # Every module of the source tree is installed (a folder without __init__.py would be skipped).
    modules = {p.relative_to(REPO / "src" / "aggzoo").as_posix() for p in (REPO / "src" / "aggzoo").rglob("*.py")}
    assert modules <= {p.relative_to(package).as_posix() for p in package.rglob("*.py")}
    shipped = sorted(p.relative_to(REPO / "conf").as_posix() for p in (REPO / "conf").rglob("*.yaml"))
    installed = sorted(p.relative_to(package / "conf").as_posix() for p in (package / "conf").rglob("*.yaml"))
    assert installed == shipped and not (package / "conf").is_symlink()
    manifest = json.loads((REPO / "weights" / "manifest.json").read_text())
    files = [entry["file"] for entry in manifest["entries"]]
    assert files and (package / "weights" / "manifest.json").read_bytes() == (REPO / "weights" / "manifest.json").read_bytes()
    for name in files:
        assert sha256_of(package / "weights" / name) == sha256_of(REPO / "weights" / name), name


def test_aggzoo_train_runs_the_default_job_from_an_empty_folder(venv: Path, tmp_path: Path) -> None:
    work = tmp_path / "empty"
    work.mkdir()
    env = _clean_env(tmp_path)
    where = _run([str(venv / "bin" / "python"), "-c", "import aggzoo; print(aggzoo.__file__)"], cwd=work, env=env)
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout  # the installed copy, not the checkout's
    _run([str(venv / "bin" / "aggzoo-train"), *TINY], cwd=work, env=env)
    (run,) = (work / "logs" / "train" / "runs").iterdir()
    assert (run / "checkpoints" / "last.ckpt").is_file()
    rows = json.loads((run / "test_results.json").read_text())["results"]
    assert [row["name"] for row in rows] == ["synthetic_test"] * len(rows) and rows
    # The synthetic city went to the user cache; the installed package was not written to.
    assert list((tmp_path / "home" / ".cache" / "aggzoo" / "synthetic_city").iterdir())
    (package,) = (venv / "lib").glob("python*/site-packages/aggzoo")
    assert not [p for p in package.rglob("*") if p.suffix in (".ckpt", ".json", ".png") and "weights" not in p.parts]
