"""Headless Chromium driven through the DevTools protocol, for tests that look at a page as a person would.

Starts Debian's ``/usr/bin/chromium`` headless with its own throw-away profile, talks to the
page's DevTools websocket (``websocket-client``), and offers: set a viewport, open a file, run a
JavaScript expression, record every URL the page requested, take a PNG screenshot. The browser
(and every process it started: one process group) ends when the context manager exits.

Also a tiny CLI to take the screenshot committed under docs/:
``.venv/bin/python tests/integration/chromium_page.py REPORT.html OUT.png [WIDTH HEIGHT]``.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--remote-debugging-port=0")
START_DEADLINE_S = 90.0
CALL_DEADLINE_S = 120.0


class ChromiumError(RuntimeError):
    """The browser did not start or did not answer in time."""


class Chromium:
    def __init__(self, binary: Path = CHROMIUM):
        self.binary = binary
        self.profile = Path(tempfile.mkdtemp(prefix="specdeploy-chromium-"))
        self.proc: subprocess.Popen | None = None
        self.ws = None
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def __enter__(self) -> "Chromium":
        log = open(self.profile / "chromium.log", "wb")
        self.proc = subprocess.Popen([str(self.binary), *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        try:
            self._connect(self._wait_port())
            self.call("Page.enable")
            self.call("Network.enable")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.ws is not None:
            try:
                self.ws.send(json.dumps({"id": -1, "method": "Browser.close"}))
            except Exception:  # noqa: BLE001 - already gone: the process group is ended below
                pass
            self.ws.close()
        if self.proc is not None:
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # helpers (zygote, renderer) share the group
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=20)
            _wait_group_gone(self.proc.pid)
        shutil.rmtree(self.profile, ignore_errors=True)

    def _wait_port(self) -> int:
        marker = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + START_DEADLINE_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ChromiumError(f"chromium exited with {self.proc.returncode}: {self._log_tail()}")
            if marker.is_file():
                lines = marker.read_text().split()
                if lines and lines[0].isdigit():
                    return int(lines[0])
            time.sleep(0.1)
        raise ChromiumError(f"chromium wrote no DevToolsActivePort within {START_DEADLINE_S:.0f} s: {self._log_tail()}")

    def _log_tail(self) -> str:
        path = self.profile / "chromium.log"
        return path.read_text(errors="replace")[-2000:] if path.is_file() else ""

    def _connect(self, port: int) -> None:
        import websocket

        deadline = time.monotonic() + START_DEADLINE_S
        while True:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as resp:
                pages = [t for t in json.load(resp) if t.get("type") == "page"]
            if pages or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if not pages:
            raise ChromiumError("chromium has no page target")
        self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=CALL_DEADLINE_S,
                                              suppress_origin=True)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one DevTools command and return its result (events seen meanwhile are kept)."""
        self.next_id += 1
        my_id = self.next_id
        self.ws.send(json.dumps({"id": my_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == my_id:
                if "error" in message:
                    raise ChromiumError(f"{method}: {message['error']}")
                return message.get("result", {})
            if "method" in message:
                self.events.append(message)

    def wait_event(self, method: str) -> dict[str, Any]:
        for i, event in enumerate(self.events):
            if event["method"] == method:
                return self.events.pop(i)
        while True:
            message = json.loads(self.ws.recv())
            if message.get("method") == method:
                return message
            if "method" in message:
                self.events.append(message)

    def viewport(self, width: int, height: int, *, mobile: bool = False) -> None:
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=mobile)

    def open(self, path: Path) -> None:
        self.events.clear()
        self.call("Page.navigate", url=path.resolve().as_uri())
        self.wait_event("Page.loadEventFired")

    def requested_urls(self) -> list[str]:
        return [e["params"]["request"]["url"] for e in self.events if e["method"] == "Network.requestWillBeSent"]

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise ChromiumError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, out: Path, *, full_page: bool = False) -> Path:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            params["captureBeyondViewport"] = True
        out.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", **params)["data"]))
        return out


def _wait_group_gone(pgid: int, deadline_s: float = 20.0) -> None:
    """Poll until no process of the group is left (the helpers exit just after the browser)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


def main(argv: list[str]) -> int:
    page, out = Path(argv[0]), Path(argv[1])
    width, height = (int(argv[2]), int(argv[3])) if len(argv) >= 4 else (1280, 800)
    with Chromium() as browser:
        browser.viewport(width, height)
        browser.open(page)
        browser.screenshot(out)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
