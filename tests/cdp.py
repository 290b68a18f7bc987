"""A tiny Chrome DevTools Protocol client over ``--remote-debugging-pipe``, for the browser tests.

Headless Chromium (Debian's ``chromium`` package) reads JSON commands from file descriptor 3 and
writes replies and events to 4, each message ended by a NUL byte. The standard library is enough for
that: no websocket client, no driver binary (chromedriver), no Playwright or Selenium download.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["Chromium", "chromium_binary"]


def chromium_binary() -> str | None:
    """Debian's chromium (or a chromium / google-chrome on PATH), else ``None``."""
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


class Chromium:
    """One headless browser with one page. ``with Chromium() as browser: browser.goto(url)``."""

    def __init__(self, width: int = 1280, height: int = 900, timeout: float = 60.0) -> None:
        binary = chromium_binary()
        if binary is None:
            raise FileNotFoundError("no chromium on PATH (apt-get install chromium)")
        self.timeout = timeout
        self._profile = tempfile.mkdtemp(prefix="aggzoo-chromium-")
        flags = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--no-default-browser-check", "--disable-extensions", "--hide-scrollbars", "--mute-audio",
                 f"--user-data-dir={self._profile}", f"--window-size={width},{height}", "--remote-debugging-pipe",
                 "about:blank"]
        # The shell puts our stdin/stdout pipes at descriptors 3 and 4, where Chromium expects them
        # (no preexec_fn: the test process runs a web server in threads).
        self._process = subprocess.Popen(
            ["sh", "-c", 'exec "$0" "$@" 3<&0 4>&1 0</dev/null 1>/dev/null 2>/dev/null', binary, *flags],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        self._to_browser = self._process.stdin.fileno()
        self._from_browser = self._process.stdout.fileno()
        self._buffer = b""
        self._next_id = 0
        self.session: str | None = None
        page = next(t for t in self.call("Target.getTargets")["targetInfos"] if t["type"] == "page")
        self.session = self.call("Target.attachToTarget", targetId=page["targetId"], flatten=True)["sessionId"]
        self.call("Page.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    # -- protocol ----------------------------------------------------------------------------------
    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("no reply from chromium")
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise ConnectionError("chromium closed its debugging pipe")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one command (to the page once attached) and return its ``result``."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if self.session is not None and not method.startswith("Target."):
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    # -- page helpers ------------------------------------------------------------------------------
    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r}: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float | None = None) -> Any:
        """Poll ``expression`` until it is truthy; returns its value."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.2)
        raise TimeoutError(f"waited {timeout or self.timeout:.0f} s for {expression}")

    def goto(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete'")

    def screenshot(self, path: str | Path) -> Path:
        """A PNG of the whole page (beyond the window's height)."""
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        path = Path(path)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (OSError, RuntimeError, TimeoutError, ConnectionError):
            pass
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        for pipe in (self._process.stdin, self._process.stdout):
            pipe.close()
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
