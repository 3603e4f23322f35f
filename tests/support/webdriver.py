"""A small W3C WebDriver client for Debian's chromedriver and chromium (no selenium).

``Browser()`` starts ``chromedriver`` on a free loopback port and opens one headless
chromium session through it; its methods are the few WebDriver commands the dashboard's
browser test needs.  Everything stays on loopback.
"""

from __future__ import annotations

import base64
import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ELEMENT = "element-6066-11e4-a52e-4f735466cecf"  # the W3C key of an element reference
CHROMIUM = "/usr/bin/chromium"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Browser:
    """One headless chromium session, driven over WebDriver's HTTP API."""

    def __init__(self, profile: Path) -> None:
        driver = shutil.which("chromedriver")
        assert driver is not None and Path(CHROMIUM).exists(), "apt-get install chromium chromium-driver"
        self.port = _free_port()
        self.proc = subprocess.Popen([driver, f"--port={self.port}", "--allowed-ips=127.0.0.1"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.base = f"http://127.0.0.1:{self.port}"
        self.session = ""
        try:
            self._wait_ready()
            options = {"binary": CHROMIUM, "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--user-data-dir={profile}", "--window-size=1280,1100", "--no-first-run"]}
            made = self._call("POST", "/session", {"capabilities": {"alwaysMatch": {
                "browserName": "chrome", "goog:chromeOptions": options}}})
            self.session = made["sessionId"]
        except BaseException:
            self.proc.kill()
            self.proc.wait()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 30
        while True:
            try:
                if self._call("GET", "/status")["ready"]:
                    return
            except OSError:
                pass
            assert time.monotonic() < deadline, "chromedriver did not start"
            time.sleep(0.1)

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return json.load(response)["value"]
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"webdriver {method} {path}: {exc.code} {exc.read()[:500]!r}") from None

    def command(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One command of this session (``path`` after ``/session/ID``)."""
        return self._call(method, f"/session/{self.session}{path}", body)

    def get(self, url: str) -> None:
        """Navigate to ``url``."""
        self.command("POST", "/url", {"url": url})

    def find(self, css: str) -> list[str]:
        """The elements ``css`` selects, as WebDriver references."""
        return [found[ELEMENT] for found in self.command("POST", "/elements", {"using": "css selector", "value": css})]

    def text(self, css: str) -> str:
        """The rendered text of the first element ``css`` selects ("" when none), found again
        if the live page redrew it between the find and the read."""
        for _ in range(5):
            found = self.find(css)
            if not found:
                return ""
            try:
                return str(self.command("GET", f"/element/{found[0]}/text"))
            except AssertionError as exc:
                if "stale element" not in str(exc):
                    raise
        raise AssertionError(f"{css} kept being redrawn")

    def click(self, css: str) -> None:
        """Click the first element ``css`` selects (found again if the page redrew it meanwhile)."""
        for _ in range(5):
            (first, *_) = self.find(css)
            try:
                self.command("POST", f"/element/{first}/click", {})
                return
            except AssertionError as exc:
                if "stale element" not in str(exc):
                    raise
        raise AssertionError(f"{css} kept being redrawn")

    def type(self, css: str, text: str) -> None:
        """Clear the first input ``css`` selects and type ``text`` into it."""
        (first, *_) = self.find(css)
        self.command("POST", f"/element/{first}/clear", {})
        if text:
            self.command("POST", f"/element/{first}/value", {"text": text})

    def script(self, source: str, *args: Any) -> Any:
        """Run ``source`` (a function body) in the page; its return value."""
        return self.command("POST", "/execute/sync", {"script": source, "args": list(args)})

    def screenshot(self, path: Path) -> Path:
        """Save the viewport as a PNG at ``path``."""
        path.write_bytes(base64.b64decode(self.command("GET", "/screenshot")))
        return path

    def wait_until(self, condition: Callable[[], Any], what: str, timeout: float = 90) -> Any:
        """Poll ``condition()`` until it is truthy (sequencing, not a timing assertion); its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = condition()
            if value:
                return value
            assert time.monotonic() < deadline, f"the page never showed {what}"
            time.sleep(0.2)

    def close(self) -> None:
        """End the session and chromedriver."""
        try:
            if self.session:
                self.command("DELETE", "")
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def shot(browser: Browser, shots: Path, name: str) -> None:
    """A screenshot of the page as ``shots/NAME.png``; its path printed, for a person to look at."""
    shots.mkdir(exist_ok=True)
    print(f"screenshot: {browser.screenshot(shots / f'{name}.png')}")
