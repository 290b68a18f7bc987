"""Progress bars over dataset loops (issue 12, item 6): shown on request or on a terminal, silent otherwise."""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from aggzoo.data.image_policy import scan_images


def _files(folder: Path) -> list[Path]:
    paths = []
    for i in range(5):
        path = folder / f"{i}.png"
        Image.new("RGB", (4, 4), (i, 0, 0)).save(path)
        paths.append(path)
    (folder / "bad.jpg").write_bytes(b"not an image")
    return [*paths, folder / "bad.jpg"]


def test_the_header_scan_shows_a_bar_only_when_asked_or_on_a_terminal(tmp_path: Path, capsys) -> None:
    paths = _files(tmp_path)
    assert set(scan_images(paths, full=False, progress=True)) == {5}
    err = capsys.readouterr().err
    assert "reading image headers" in err and "/6" in err
    assert set(scan_images(paths, full=False)) == {5}  # stderr is not a terminal under pytest
    assert capsys.readouterr().err == ""
