"""The ``aggzoo`` console command as a shell user meets it: ``aggzoo models | head`` ends quietly
(issue 25, point 10), and ``aggzoo export`` does not overwrite an existing file unless ``--force``
(point 12)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from entry_helpers import REPO, error_line, run_entry


def test_a_closed_pipe_ends_the_listing_without_a_traceback(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH")) if p),
               AGGZOO_OFFLINE="1", AGGZOO_CACHE=str(tmp_path / "cache"))
    # The reader is gone before the listing is written (it closes its end at once, as a `head` that has
    # read its lines): every write meets EPIPE, not only the ones of a slow reader.
    process = subprocess.Popen([sys.executable, "-m", "aggzoo.cli.main", "models"], cwd=REPO, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()
    stderr = process.stderr.read().decode()
    status = process.wait(timeout=300)
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr and "Exception ignored" not in stderr, stderr
    assert status == 1, stderr


def test_export_refuses_to_overwrite_a_file_unless_forced(tmp_path: Path) -> None:
    output = tmp_path / "existing.txt"
    output.write_text("my notes\n")
    args = ["-m", "aggzoo.cli.main", "export", "gem_efficientnet_lite0", "--format", "torchscript", "--output", str(output),
            "--image-size", "64", "64"]
    line = error_line(run_entry(args, tmp_path, script=None))
    assert line == f"error: {output} exists; pass --force to overwrite it, or --output <another file>", line
    assert output.read_text() == "my notes\n"
    forced = run_entry([*args, "--force"], tmp_path, script=None)
    assert forced.returncode == 0, forced.stderr[-3000:]
    assert output.read_bytes()[:2] == b"PK"  # a TorchScript archive (zip) now


def test_info_describes_a_saved_folder(tmp_path: Path) -> None:
    """Issue 25, point 15: ``aggzoo info`` takes what ``eval.py model=`` takes, not only registered names."""
    import aggzoo
    from aggzoo.hub.cfg import PretrainedCfg

    model = aggzoo.create_model("gem_efficientnet_lite0", pretrained_backbone=False)
    saved = aggzoo.save_pretrained(model, tmp_path / "my model", pretrained_cfg=PretrainedCfg(
        architecture="gem_efficientnet_lite0", tag="mine", input_size=(3, 64, 96), license="CC-BY-4.0"))
    for name in (f"local-dir:{saved}", str(saved)):
        shown = run_entry(["-m", "aggzoo.cli.main", "info", name], tmp_path, script=None)
        assert shown.returncode == 0, shown.stderr[-3000:]
        lines = shown.stdout.splitlines()
        assert lines[0] == name and "gem_efficientnet_lite0 (GeM head on " in shown.stdout, shown.stdout
        assert "input 64 x 96 (H x W)" in shown.stdout and "CC-BY-4.0" in shown.stdout, shown.stdout
    missing = run_entry(["-m", "aggzoo.cli.main", "info", "local-dir:/no/such/folder"], tmp_path, script=None)
    line = error_line(missing)
    assert "/no/such/folder" in line, line
