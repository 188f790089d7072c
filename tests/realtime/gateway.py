"""A real gateway on 127.0.0.1 around the shared engine, with its app in reach (peers, sessions)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from voicewire.engine import Engine
from voicewire.realtime.config import GatewayConfig
from voicewire.realtime.gateway import GATEWAY
from voicewire.realtime.server import create_app, make_runner


@dataclass
class Gateway:
    url: str  # http://127.0.0.1:PORT
    app: web.Application

    @property
    def peers(self) -> set[Any]:
        return self.app[GATEWAY].peers

    @property
    def sessions(self) -> set[Any]:
        return self.app[GATEWAY].sessions


@contextlib.asynccontextmanager
async def gateway(engine: Engine, **config: Any) -> AsyncIterator[Gateway]:
    """A real gateway on 127.0.0.1 (free port) around the shared engine."""
    app = create_app(GatewayConfig(**config), engine=engine)
    runner = make_runner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield Gateway(f"http://127.0.0.1:{port}", app)
    finally:
        await runner.cleanup()


async def wait_gone(engine: Engine, gw: Gateway, timeout_s: float) -> float:
    """Seconds until no peer, session or engine stream is left; fails after ``timeout_s``."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout_s:
        if not gw.peers and not gw.sessions and engine.active_streams() == 0:
            return time.perf_counter() - t0
        await asyncio.sleep(0.01)
    raise AssertionError(
        f"after {timeout_s} s: {len(gw.peers)} peers, {len(gw.sessions)} sessions, "
        f"{engine.active_streams()} engine streams"
    )
