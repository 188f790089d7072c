"""The gateway application: one aiohttp app serving the WebSocket, HTTP and the demo page."""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path

from aiohttp import web

from engine import Engine

from .auth import AuthError, api_key_from_headers
from .config import GatewayConfig
from .gateway import GATEWAY, Gateway
from .http_api import healthz_handler, speech_handler
from .webrtc import setup_webrtc
from .websocket import stream_handler

log = logging.getLogger("voicewire.server")

WEB_DIR = Path(__file__).resolve().parent.parent / "web"


def create_app(config: GatewayConfig | None = None, engine: Engine | None = None) -> web.Application:
    """The app. If ``engine`` is given the caller owns it; otherwise the app starts and stops one."""
    config = config or GatewayConfig()
    app = web.Application(client_max_size=config.max_http_body_bytes)
    owns_engine = engine is None
    gw = Gateway.create(config, engine or Engine(config.engine))
    app[GATEWAY] = gw

    async def on_startup(app: web.Application) -> None:
        if owns_engine:
            await asyncio.get_running_loop().run_in_executor(None, gw.engine.start)

    async def on_shutdown(app: web.Application) -> None:
        for session in list(gw.sessions):
            await session.close()

    async def on_cleanup(app: web.Application) -> None:
        if owns_engine:
            await asyncio.get_running_loop().run_in_executor(None, gw.engine.close)

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)
    app.on_cleanup.append(on_cleanup)
    app.router.add_get("/v1/stream", stream_handler)
    app.router.add_post("/v1/audio/speech", speech_handler)
    app.router.add_get("/healthz", healthz_handler)
    app.router.add_get("/readyz", readyz_handler)
    app.router.add_get("/metrics", metrics_handler)
    app.router.add_post("/v1/session-tokens", session_token_handler)
    setup_webrtc(app)  # POST /offer; closes its peers on shutdown
    web_dir = Path(config.web_dir) if config.web_dir else WEB_DIR
    if (web_dir / "index.html").exists():
        index = web_dir / "index.html"

        async def index_handler(request: web.Request) -> web.FileResponse:
            return web.FileResponse(index)

        app.router.add_get("/", index_handler)
        app.router.add_static("/static/", web_dir)
    return app


async def readyz_handler(request: web.Request) -> web.Response:
    """Ready to take sessions: the engine runs and the server is not draining."""
    gw = request.app[GATEWAY]
    if gw.draining:
        return web.json_response({"status": "draining"}, status=503)
    try:
        gw.engine.model  # noqa: B018 - raises until the engine has started
    except RuntimeError:
        return web.json_response({"status": "starting"}, status=503)
    return web.json_response({"status": "ready"})


async def metrics_handler(request: web.Request) -> web.Response:
    return web.Response(
        body=request.app[GATEWAY].metrics.render(), content_type="text/plain", charset="utf-8"
    )


async def session_token_handler(request: web.Request) -> web.Response:
    """Mint a short-lived single-use session token for a browser. Needs the API key when auth is on."""
    gw = request.app[GATEWAY]
    auth = gw.auth
    try:
        if auth.config.enabled:
            auth.check_api_key(api_key_from_headers(request.headers))
    except AuthError as err:
        gw.metrics.errors.labels(err.code).inc()
        return web.json_response({"error": {"code": err.code, "message": err.message}}, status=err.status)
    token, exp = auth.mint()
    return web.json_response({"token": token, "expires_at": exp, "ttl_s": auth.config.token_ttl_s})


async def drain(app: web.Application, timeout_s: float) -> None:
    """Refuse new sessions, let current turns finish (at most ``timeout_s``)."""
    gw = app[GATEWAY]
    gw.draining = True
    deadline = asyncio.get_running_loop().time() + timeout_s
    while any(s.open_turns for s in gw.sessions) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)


async def serve(config: GatewayConfig) -> None:
    """Run until SIGTERM or SIGINT; then drain (no new sessions, current turns finish) and exit."""
    app = create_app(config)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    await site.start()
    log.info("voicewire listening on http://%s:%d (model %s)", config.host, config.port, config.engine.model)
    print(f"voicewire: serving {config.engine.model} on http://{config.host}:{config.port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
        log.info("draining: %d sessions open", len(app[GATEWAY].sessions))
        await drain(app, config.drain_timeout_s)
    finally:
        await runner.cleanup()
    log.info("stopped")
