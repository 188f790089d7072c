"""The gateway application: one aiohttp app serving the WebSocket, HTTP and the demo page."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from aiohttp import web

from engine import Engine

from .config import GatewayConfig
from .http_api import healthz_handler, speech_handler
from .webrtc import setup_webrtc
from .websocket import stream_handler

log = logging.getLogger("voicewire.server")

WEB_DIR = Path(__file__).resolve().parent.parent / "web"


def create_app(config: GatewayConfig | None = None, engine: Engine | None = None) -> web.Application:
    """The app. If ``engine`` is given the caller owns it; otherwise the app starts and stops one."""
    config = config or GatewayConfig()
    app = web.Application(client_max_size=config.max_http_body_bytes)
    app["config"] = config
    app["sessions"] = set()
    owns_engine = engine is None
    app["engine"] = engine or Engine(config.engine)

    async def on_startup(app: web.Application) -> None:
        if owns_engine:
            await asyncio.get_running_loop().run_in_executor(None, app["engine"].start)

    async def on_shutdown(app: web.Application) -> None:
        for session in list(app["sessions"]):
            await session.close()

    async def on_cleanup(app: web.Application) -> None:
        if owns_engine:
            await asyncio.get_running_loop().run_in_executor(None, app["engine"].close)

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)
    app.on_cleanup.append(on_cleanup)
    app.router.add_get("/v1/stream", stream_handler)
    app.router.add_post("/v1/audio/speech", speech_handler)
    app.router.add_get("/healthz", healthz_handler)
    setup_webrtc(app)  # POST /offer; closes its peers on shutdown
    web_dir = Path(config.web_dir) if config.web_dir else WEB_DIR
    if (web_dir / "index.html").exists():
        index = web_dir / "index.html"

        async def index_handler(request: web.Request) -> web.FileResponse:
            return web.FileResponse(index)

        app.router.add_get("/", index_handler)
        app.router.add_static("/static/", web_dir)
    return app


async def serve(config: GatewayConfig) -> None:
    """Run until cancelled (Ctrl-C)."""
    app = create_app(config)
    runner = web.AppRunner(app, handle_signals=True)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    await site.start()
    log.info("voicewire listening on http://%s:%d (model %s)", config.host, config.port, config.engine.model)
    print(f"voicewire: serving {config.engine.model} on http://{config.host}:{config.port}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
