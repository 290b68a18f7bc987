"""Regenerate ``docs/demo.png``: the default demo (the shipped synthetic model on the synthetic
city's test split) in headless Chromium, one example query submitted, the page captured.

    PYTHONPATH=src python docs/demo_screenshot.py [--query N] [--out docs/demo.png]

Needs the ``demo`` extra (Gradio) and Debian's ``chromium``; drives it with ``tests/cdp.py``.
The PNG is reduced to a 256-colour palette to stay small.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the browser client of the tests

from cdp import Chromium  # noqa: E402

from aggzoo.cli import demo  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--query", type=int, default=5, help="which example query to submit (its thumbnail index)")
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "demo.png")
    args = parser.parse_args()
    search = demo.prepare(demo.DemoOptions())
    app = demo.launch(demo.build_app(search, name=demo.DEFAULT_MODEL, k=args.k), block=False)
    try:
        with Chromium(width=1280, height=900) as browser, tempfile.TemporaryDirectory() as tmp:
            browser.goto(app.local_url)
            browser.wait_for(f"document.querySelectorAll('#examples button.gallery-item').length > {args.query}")
            browser.evaluate(f"document.querySelectorAll('#examples button.gallery-item')[{args.query}].click()")
            browser.wait_for("document.querySelector('#query img') !== null")
            browser.evaluate("document.querySelector('#search').click()")
            browser.wait_for(f"(() => {{ const imgs = [...document.querySelectorAll('#results img')];"
                             f" return imgs.length >= {args.k} && imgs.every(i => i.complete && i.naturalWidth > 0); }})()")
            shot = browser.screenshot(Path(tmp) / "demo.png")
            Image.open(shot).convert("RGB").quantize(256).save(args.out, optimize=True)
    finally:
        app.close()
    print(f"wrote {args.out} ({args.out.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
