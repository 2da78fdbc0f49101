"""A headless Chromium driven over the DevTools protocol, for tests that look at the built site as a reader does.

``Browser`` starts ``chromium-headless-shell`` (Debian's package, or ``chromium``) with its own profile in a
temporary folder and a DevTools port of its own choosing, opens one page target and talks to it over a
websocket (aiohttp's client): ``goto`` loads a URL and waits for the load event, ``js`` evaluates an expression
in the page and returns its value, ``wait_for`` polls an expression until it is truthy. The browser runs in a
session of its own; ``close`` (a context manager) stops its whole process group and removes its profile.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import aiohttp

CANDIDATES = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")
INSTALL_HINT = ("no headless Chromium on PATH: `make test` installs Debian's chromium-headless-shell as root "
                "(apt-get install chromium-headless-shell); see docs/development.md")


def group_alive(pgid: int) -> bool:
    """True while a process of group ``pgid`` other than a zombie is left."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def find_chromium() -> str | None:
    return next((p for p in map(shutil.which, CANDIDATES) if p), None)


class Browser:
    def __init__(self, timeout: float = 30.0):
        exe = find_chromium()
        if exe is None:
            raise RuntimeError(INSTALL_HINT)
        self.timeout = timeout
        self.profile = Path(tempfile.mkdtemp(prefix="chromium-profile-"))
        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
             f"--user-data-dir={self.profile}", "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1",
             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        # Debian's chromium-headless-shell is a shell script that runs the browser as its child: the browser and
        # its helpers are stopped as the session's process group, never through the script's pid alone
        self.group = self.proc.pid
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while not (port_file.is_file() and port_file.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"{exe} did not open its DevTools port (exit {self.proc.returncode})")
            time.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=timeout) as r:
            page = next(t for t in json.load(r) if t["type"] == "page")
        self.loop = asyncio.new_event_loop()
        self.ids = itertools.count(1)
        self.session = self.loop.run_until_complete(self._session())
        self.ws = self.loop.run_until_complete(self.session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0))
        self.call("Page.enable")
        self.call("Runtime.enable")

    async def _session(self):
        return aiohttp.ClientSession()

    async def _call(self, method: str, params: dict, until_event: str | None) -> dict:
        ident = next(self.ids)
        await self.ws.send_json({"id": ident, "method": method, "params": params})
        result, seen_event = None, until_event is None
        while result is None or not seen_event:
            msg = await asyncio.wait_for(self.ws.receive_json(), self.timeout)
            if msg.get("id") == ident:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                result = msg["result"]
            elif msg.get("method") == until_event:
                seen_event = True
        return result

    def call(self, method: str, until_event: str | None = None, **params) -> dict:
        return self.loop.run_until_complete(self._call(method, params, until_event))

    def goto(self, url: str) -> None:
        self.call("Page.navigate", until_event="Page.loadEventFired", url=url)

    def js(self, expression: str):
        res = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in res:
            raise RuntimeError(f"{expression}: {res['exceptionDetails']}")
        return res["result"].get("value")

    def wait_for(self, expression: str, timeout: float | None = None):
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            value = self.js(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"still false after {timeout or self.timeout} s: {expression}")
            time.sleep(0.1)

    def close(self) -> None:
        if getattr(self, "ws", None) is not None:
            self.loop.run_until_complete(self.ws.close())
            self.loop.run_until_complete(self.session.close())
            self.loop.close()
            self.ws = None
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.group, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and group_alive(self.group):
                self.proc.poll()  # reap the script
                time.sleep(0.05)
            if not group_alive(self.group):
                break
        self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
