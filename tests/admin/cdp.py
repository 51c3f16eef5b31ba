"""A tiny Chrome DevTools Protocol client over trio-websocket, for the console's browser tests.

Why this and not Playwright or Selenium: Debian's ``chromium`` speaks CDP itself; trio-websocket
is already a dependency of the node; so the tests need no browser download (Playwright's
installer fetches its own build, which this workplace cannot reach) and no chromedriver whose
version must match the browser.  About 150 lines cover what the tests do: open a page, evaluate
JavaScript, type, press keys, resize, take screenshots, and collect console errors.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import tempfile
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

import trio
from trio_websocket import open_websocket_url

__all__ = ["Browser", "CdpError", "Page", "find_chromium", "open_browser"]

#: CDP messages carry base64 screenshots: allow large ones.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
#: How long the browser may take to write its DevTools port.
START_TIMEOUT_S = 30.0


class CdpError(RuntimeError):
    pass


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """One browser connection; pages are flattened target sessions on it."""

    def __init__(self, ws):
        self.ws = ws
        self._next = 0
        self._pending: dict[int, list] = {}
        self.pages: dict[str, "Page"] = {}

    async def reader(self) -> None:
        while True:
            msg = json.loads(await self.ws.get_message())
            if "id" in msg:
                slot = self._pending.pop(msg["id"], None)
                if slot is not None:
                    slot[1] = msg
                    slot[0].set()
            elif msg.get("sessionId") in self.pages:
                self.pages[msg["sessionId"]].on_event(msg["method"], msg.get("params", {}))

    async def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._next += 1
        slot = [trio.Event(), None]
        self._pending[self._next] = slot
        msg: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        await self.ws.send_message(json.dumps(msg))
        with trio.fail_after(60):
            await slot[0].wait()
        reply = slot[1]
        if "error" in reply:
            raise CdpError(f"{method}: {reply['error'].get('message')}")
        return reply.get("result", {})

    async def new_page(self, width: int = 1280, height: int = 800) -> "Page":
        target = (await self.send("Target.createTarget", {"url": "about:blank"}))["targetId"]
        session = (await self.send("Target.attachToTarget", {"targetId": target, "flatten": True}))["sessionId"]
        page = Page(self, session, target)
        self.pages[session] = page
        for domain in ("Page", "Runtime", "Log"):
            await page.send(f"{domain}.enable")
        await page.viewport(width, height)
        return page


class Page:
    def __init__(self, browser: Browser, session: str, target: str):
        self.browser, self.session, self.target = browser, session, target
        self.errors: list[str] = []  # console errors, uncaught exceptions, failed loads
        self.loaded = trio.Event()

    def on_event(self, method: str, params: dict) -> None:
        if method == "Runtime.exceptionThrown":
            d = params.get("exceptionDetails", {})
            self.errors.append("exception: " + (d.get("exception", {}).get("description") or d.get("text", "")))
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            self.errors.append(
                "console.error: "
                + " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
            )
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            e = params["entry"]
            self.errors.append(f"log: {e.get('text')} {e.get('url', '')}")
        elif method == "Page.loadEventFired":
            self.loaded.set()

    async def send(self, method: str, params: dict | None = None) -> dict:
        return await self.browser.send(method, params, self.session)

    async def goto(self, url: str) -> None:
        self.loaded = trio.Event()
        r = await self.send("Page.navigate", {"url": url})
        if r.get("errorText"):
            raise CdpError(f"navigating to {url}: {r['errorText']}")
        if r.get("loaderId"):  # a new document (a fragment change has none)
            with trio.fail_after(30):
                await self.loaded.wait()
                # a late load event of the previous document may have come first: check this one's
                while await self.evaluate("location.href + ' ' + document.readyState") != f"{url} complete":
                    await trio.sleep(0.05)

    async def evaluate(self, expression: str) -> Any:
        r = await self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in r:
            raise CdpError(f"{expression[:80]}: {r['exceptionDetails'].get('exception', {}).get('description')}")
        return r.get("result", {}).get("value")

    async def wait_for(self, expression: str, timeout: float = 20.0, what: str = "") -> Any:
        """The first truthy value of ``expression``, polled; TimeoutError names what was awaited."""
        last = None
        with trio.move_on_after(timeout):
            while True:  # an element comes back as {} by value: make it true
                try:
                    last = await self.evaluate(
                        f"(() => {{ const v = ({expression}); return v instanceof Node ? true : v; }})()"
                    )
                except CdpError as exc:  # e.g. while a reload replaces the document: try again
                    last = exc
                else:
                    if last:
                        return last
                await trio.sleep(0.1)
        raise TimeoutError(f"page never showed {what or expression} within {timeout:g} s (last: {last!r})")

    async def viewport(self, width: int, height: int, mobile: bool = False) -> None:
        await self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile},
        )

    async def screenshot(self, path: Path) -> None:
        data = (await self.send("Page.captureScreenshot", {"format": "png"}))["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))

    async def type_into(self, selector: str, text: str) -> None:
        await self.evaluate(
            f"(() => {{ const el = document.querySelector({json.dumps(selector)}); el.focus(); el.value = ''; }})()"
        )
        await self.send("Input.insertText", {"text": text})

    async def press(self, key: str, code: str | None = None, key_code: int | None = None, shift: bool = False) -> None:
        params = {
            "key": key,
            "code": code or key,
            "windowsVirtualKeyCode": key_code or 0,
            "modifiers": 8 if shift else 0,
        }
        await self.send("Input.dispatchKeyEvent", {"type": "rawKeyDown", **params})
        if key == "Enter":
            await self.send("Input.dispatchKeyEvent", {"type": "char", "text": "\r", **params})
        await self.send("Input.dispatchKeyEvent", {"type": "keyUp", **params})

    async def click(self, selector: str) -> None:
        await self.evaluate(f"document.querySelector({json.dumps(selector)}).click()")

    async def close(self) -> None:
        await self.browser.send("Target.closeTarget", {"targetId": self.target})


@asynccontextmanager
async def open_browser(executable: str) -> AsyncIterator[Browser]:
    """A headless Chromium with its own profile, connected over CDP; killed and removed at exit."""
    profile = Path(tempfile.mkdtemp(prefix="hydra-chromium-"))
    proc = subprocess.Popen(
        [
            executable,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--remote-debugging-port=0",
            "--remote-debugging-address=127.0.0.1",
            f"--user-data-dir={profile}",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        port_file = profile / "DevToolsActivePort"
        with trio.fail_after(START_TIMEOUT_S):
            while not (port_file.exists() and len(port_file.read_text().splitlines()) >= 2):
                if proc.poll() is not None:
                    raise CdpError(f"chromium exited with {proc.returncode}")
                await trio.sleep(0.05)
        port, path = port_file.read_text().splitlines()[:2]
        async with open_websocket_url(f"ws://127.0.0.1:{port}{path}", max_message_size=MAX_MESSAGE_BYTES) as ws:
            browser = Browser(ws)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(browser.reader)
                try:
                    yield browser
                finally:
                    nursery.cancel_scope.cancel()
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        shutil.rmtree(profile, ignore_errors=True)
