"""Drive Debian's headless chromium over the Chrome DevTools Protocol, for browser tests.

The only dependency beyond the standard library is ``websocket-client`` (pinned in
requirements.txt). Usage::

    with Chromium() as browser:
        page = browser.page()
        page.call("Page.enable")
        page.navigate("http://127.0.0.1:8088/chat/")
        page.evaluate("document.title")

Events are handled as they arrive: ``page.on("Fetch.authRequired", handler)`` registers a
callback (it may send commands with ``page.send`` but not wait for them), and every
event is also kept in ``page.events`` for later assertions.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Optional

import websocket

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> Optional[str]:
    explicit = os.environ.get("LLMFLEET_CHROMIUM")
    if explicit:
        return explicit
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


class CDPError(Exception):
    pass


class Page:
    def __init__(self, ws_url: str):
        # No Origin header: chromium refuses DevTools websockets from unknown origins.
        self._ws = websocket.create_connection(ws_url, timeout=60, suppress_origin=True)
        self._next = 0
        self._handlers: dict[str, Callable[[dict[str, Any]], None]] = {}
        self.events: list[dict[str, Any]] = []

    def close(self) -> None:
        self._ws.close()

    def on(self, method: str, handler: Callable[[dict[str, Any]], None]) -> None:
        self._handlers[method] = handler

    def send(self, method: str, params: Optional[dict[str, Any]] = None) -> int:
        self._next += 1
        self._ws.send(json.dumps({"id": self._next, "method": method, "params": params or {}}))
        return self._next

    def _dispatch(self, message: dict[str, Any]) -> None:
        self.events.append(message)
        handler = self._handlers.get(message["method"])
        if handler is not None:
            handler(message.get("params", {}))

    def pump(self, timeout: float) -> None:
        """Handle the events that arrive within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._ws.settimeout(left)
            try:
                message = json.loads(self._ws.recv())
            except websocket.WebSocketTimeoutException:
                return
            if "method" in message:
                self._dispatch(message)

    def call(
        self, method: str, params: Optional[dict[str, Any]] = None, timeout: float = 60
    ) -> dict[str, Any]:
        wanted = self.send(method, params)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._ws.settimeout(max(deadline - time.monotonic(), 0.01))
            message = json.loads(self._ws.recv())
            if "method" in message:
                self._dispatch(message)
            elif message.get("id") == wanted:
                if "error" in message:
                    raise CDPError("{}: {}".format(method, message["error"]))
                return message.get("result", {})
        raise CDPError(f"{method}: no answer within {timeout} s")

    def wait_event(self, method: str, timeout: float = 30, since: int = 0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            for event in self.events[since:]:
                if event["method"] == method:
                    return event.get("params", {})
            left = deadline - time.monotonic()
            if left <= 0:
                raise CDPError(f"no {method} event within {timeout} s")
            self.pump(min(left, 0.1))

    def navigate(self, url: str, timeout: float = 30) -> None:
        since = len(self.events)
        result = self.call("Page.navigate", {"url": url})
        if result.get("errorText"):
            raise CDPError("navigate {}: {}".format(url, result["errorText"]))
        self.wait_event("Page.loadEventFired", timeout, since)

    def evaluate(self, expression: str, timeout: float = 30) -> Any:
        result = self.call(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
            timeout,
        )
        if "exceptionDetails" in result:
            raise CDPError("evaluate {!r}: {}".format(expression, result["exceptionDetails"]))
        return result["result"].get("value")

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", {"format": "png"})["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path


class Chromium:
    """A headless chromium with its own profile directory, on a DevTools port it picks itself."""

    def __init__(self, executable: Optional[str] = None, extra_args: Optional[list[str]] = None):
        self.executable = executable or find_chromium()
        if not self.executable:
            raise FileNotFoundError("no chromium found (Debian: apt-get install -y chromium)")
        self.extra_args = list(extra_args or [])
        self._profile = tempfile.mkdtemp(prefix="llmfleet-chromium-")
        self._proc: Optional[subprocess.Popen] = None
        self._pages: list[Page] = []
        self.port = 0

    def __enter__(self) -> Chromium:
        args = [
            self.executable,
            "--headless=new",
            "--no-sandbox",  # tests run as root in a container; the sandbox needs user namespaces
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--password-store=basic",
            "--window-size=1000,760",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            "--user-data-dir=" + self._profile,
            *self.extra_args,
            "about:blank",
        ]
        self._proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        marker = Path(self._profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not marker.exists() or not marker.read_text().strip():
            if self._proc.poll() is not None:
                err = self._proc.stderr.read().decode(errors="replace") if self._proc.stderr else ""
                raise CDPError(f"chromium exited with {self._proc.returncode}: {err[-2000:]}")
            if time.monotonic() > deadline:
                self.__exit__()
                raise CDPError("chromium did not open its DevTools port within 30 s")
            time.sleep(0.1)
        self.port = int(marker.read_text().split()[0])
        return self

    def version(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/version", timeout=10) as resp:
            return json.load(resp)["Browser"]

    def page(self) -> Page:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list", timeout=10) as resp:
            targets = [t for t in json.load(resp) if t.get("type") == "page"]
        if not targets:
            raise CDPError("chromium has no page target")
        page = Page(targets[0]["webSocketDebuggerUrl"])
        self._pages.append(page)
        return page

    def __exit__(self, *exc: object) -> None:
        for page in self._pages:
            with contextlib.suppress(Exception):  # closing is best effort
                page.close()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)
        if self._proc is not None and self._proc.stderr is not None:
            self._proc.stderr.close()
        shutil.rmtree(self._profile, ignore_errors=True)
