"""A small Chrome DevTools Protocol driver for headless Chromium, over ``websockets`` (no playwright).

Shape and flags from research/chromium-webrtc.md §2: fresh profile, ``--remote-debugging-port=0``
(the port is read from ``DevToolsActivePort``), one page target attached with ``flatten``, pages
driven with ``Runtime.evaluate``. Chromium runs in its own process group so teardown can kill it all.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import websockets

CHROMIUM = "/usr/bin/chromium"
# Exactly the flags of chromium-webrtc.md: no sandbox as root (T10), autoplay without a gesture
# (T5), real IPs instead of mDNS (T2), loopback candidates (T3).
FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-sync",
    "--remote-debugging-port=0",
    "--window-size=1200,900",
    "--autoplay-policy=no-user-gesture-required",
    "--use-fake-ui-for-media-stream",
    "--allow-loopback-in-peer-connection",
]
STARTUP_TIMEOUT_S = 15.0


class CdpError(Exception):
    pass


class Page:
    """One attached page target; ``send`` carries its sessionId."""

    def __init__(self, ws: Any, session_id: str) -> None:
        self._ws = ws
        self._session_id = session_id
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._events: dict[str, asyncio.Event] = {}
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for raw in self._ws:
            msg = json.loads(raw)
            if "id" in msg and msg["id"] in self._pending:
                fut = self._pending.pop(msg["id"])
                if "error" in msg:
                    fut.set_exception(CdpError(msg["error"]))
                else:
                    fut.set_result(msg.get("result", {}))
            elif "method" in msg:
                self._events.setdefault(msg["method"], asyncio.Event()).set()

    async def send(
        self, method: str, params: dict[str, Any] | None = None, page: bool = True
    ) -> dict[str, Any]:
        msg_id = next(self._ids)
        msg: dict[str, Any] = {"id": msg_id, "method": method, "params": params or {}}
        if page:
            msg["sessionId"] = self._session_id
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[msg_id] = fut
        await self._ws.send(json.dumps(msg))
        return await fut

    def event(self, method: str) -> asyncio.Event:
        return self._events.setdefault(method, asyncio.Event())

    async def goto(self, url: str, timeout_s: float = 10.0) -> None:
        loaded = self.event("Page.loadEventFired")
        loaded.clear()
        await self.send("Page.navigate", {"url": url})
        await asyncio.wait_for(loaded.wait(), timeout_s)

    async def eval(self, expression: str, timeout_s: float = 30.0) -> Any:
        """Evaluate in the page (promises awaited); returns the JSON value or raises with the JS error."""
        result = await asyncio.wait_for(
            self.send(
                "Runtime.evaluate", {"expression": expression, "awaitPromise": True, "returnByValue": True}
            ),
            timeout_s,
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise CdpError(details.get("exception", {}).get("description") or details.get("text"))
        return result["result"].get("value")

    async def wait_for(self, condition: str, timeout_s: float) -> None:
        """Until the JavaScript expression ``condition`` is true in the page (polled every 10 ms)."""
        await self.eval(
            f"""new Promise((resolve, reject) => {{
              const t0 = performance.now();
              const tick = () => ({condition}) ? resolve(true)
                : performance.now() - t0 > {timeout_s * 1000} ? reject(new Error("timed out: {condition}"))
                : setTimeout(tick, 10);
              tick();
            }})""",
            timeout_s + 5,
        )

    async def screenshot(self, path: Path) -> None:
        data = await self.send("Page.captureScreenshot", {"format": "png"})
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data["data"]))

    async def close(self) -> None:
        self._reader.cancel()


@contextlib.asynccontextmanager
async def chromium(width: int = 1200, height: int = 900, extra_flags: tuple[str, ...] = ()) -> AsyncIterator[Page]:
    """Headless Chromium with one blank page attached; everything is torn down on exit.
    ``extra_flags``: added to FLAGS (e.g. a test certificate's --ignore-certificate-errors-spki-list)."""
    profile = tempfile.mkdtemp(prefix="voicewire-chromium-")
    log = open(Path(profile).with_suffix(".log"), "wb")  # noqa: SIM115 - ALSA/dbus noise (T8)
    proc = subprocess.Popen(
        [CHROMIUM, *FLAGS, *extra_flags, f"--user-data-dir={profile}", "about:blank"],
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    page: Page | None = None
    try:
        port_file = Path(profile) / "DevToolsActivePort"
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not (port_file.exists() and len(port_file.read_text().splitlines()) >= 2):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise CdpError(f"chromium did not start (exit {proc.poll()}), see {log.name}")
            await asyncio.sleep(0.02)
        port, path = port_file.read_text().splitlines()[:2]
        ws = await websockets.connect(f"ws://127.0.0.1:{port}{path}", max_size=None)  # no Origin (T11)
        page = Page(ws, "")
        targets = (await page.send("Target.getTargets", page=False))["targetInfos"]
        target = next(t for t in targets if t["type"] == "page")
        attached = await page.send(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}, page=False
        )
        page._session_id = attached["sessionId"]
        await page.send("Page.enable")
        await page.send("Runtime.enable")
        # An exact viewport for screenshots (T13).
        await page.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        yield page
    finally:
        if page is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(page.send("Browser.close", page=False), 2)
            await page.close()
            with contextlib.suppress(Exception):
                await page._ws.close()
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
        shutil.rmtree(profile, ignore_errors=True)
        Path(log.name).unlink(missing_ok=True)
