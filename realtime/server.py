"""The gateway application: one aiohttp app serving the WebSocket, HTTP and the demo page.

Start-up an orchestrator can trust: the port opens at once and ``/healthz`` answers while the
engine loads and warms up (tens of seconds for Qwen3-TTS graph capture) in the background;
``/readyz`` is 503 until the engine's worker runs, and requests that need the engine get 503
``not_ready`` until then.

The engine runs in the gateway's process (an ``Engine``) or out of it, as a supervised group of
engine-core processes (an ``EngineGroup``, one per replica); then ``/readyz`` is 200 only while
every replica is warm and running, and it says each replica's state.
"""

from __future__ import annotations

import asyncio
import logging
import re
import signal
from pathlib import Path

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from voicewire.engine import Engine
from voicewire.engine.core import CoreStartFailed, CoreState, EngineGroup

from .config import GatewayConfig
from .gateway import GATEWAY, Gateway
from .http_api import healthz_handler, models_handler, speech_handler, voices_handler
from .webrtc import setup_webrtc
from .websocket import stream_handler

log = logging.getLogger("voicewire.server")

WEB_DIR = Path(__file__).resolve().parent.parent / "web"


def create_app(
    config: GatewayConfig | None = None, engine: Engine | None = None, group: EngineGroup | None = None
) -> web.Application:
    """The app. If ``engine`` is given the caller owns it; otherwise the app starts and stops
    ``group`` (engine cores) if given, or an in-process engine of ``config.engine``."""
    config = config or GatewayConfig()
    app = web.Application(client_max_size=config.max_http_body_bytes)
    owns_engine = engine is None
    gw = Gateway.create(config, engine or group or Engine(config.engine))
    app[GATEWAY] = gw

    async def on_startup(app: web.Application) -> None:
        if owns_engine:
            # In the background: the port must answer health probes while the model loads.
            start: asyncio.Future[object]
            if gw.group is not None:
                start = asyncio.ensure_future(gw.group.start())
            else:
                start = asyncio.ensure_future(
                    asyncio.get_running_loop().run_in_executor(None, gw.engines[0].start)
                )
            start.add_done_callback(_log_engine_start)
            gw.engine_start = start

    async def on_shutdown(app: web.Application) -> None:
        for session in list(gw.sessions):
            await session.close()

    async def on_cleanup(app: web.Application) -> None:
        if owns_engine:
            if gw.engine_start is not None and not gw.engine_start.done():
                await asyncio.gather(gw.engine_start, return_exceptions=True)  # close after start
            if gw.group is not None:
                await gw.group.close()
            else:
                await asyncio.get_running_loop().run_in_executor(None, gw.engines[0].close)

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)
    app.on_cleanup.append(on_cleanup)
    app.router.add_get("/v1/stream", stream_handler)
    app.router.add_post("/v1/audio/speech", speech_handler)
    app.router.add_get("/healthz", healthz_handler)
    app.router.add_get("/health", healthz_handler)  # the name benchmark harnesses probe
    app.router.add_get("/v1/models", models_handler)
    app.router.add_get("/v1/audio/voices", voices_handler)
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


def _log_engine_start(task: asyncio.Future[object]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("the engine failed to start: %s", task.exception())


async def readyz_handler(request: web.Request) -> web.Response:
    """Ready to take sessions: every replica is warm and its worker runs, and the server is not
    draining. With engine cores, ``replicas`` says each one's state (a restarting replica makes
    the gateway not ready until it is back)."""
    gw = request.app[GATEWAY]
    extra = {"replicas": gw.group.describe()} if gw.group is not None else {}
    if gw.draining:
        return web.json_response({"status": "draining", **extra}, status=503)
    start = gw.engine_start
    if start is not None and start.done() and not start.cancelled() and start.exception() is not None:
        return web.json_response({"status": "failed", "error": str(start.exception()), **extra}, status=503)
    if not gw.ready:
        down = gw.group is not None and any(r.state is CoreState.DOWN for r in gw.group.replicas)
        return web.json_response({"status": "degraded" if down else "starting", **extra}, status=503)
    return web.json_response({"status": "ready", **extra})


async def metrics_handler(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    if not gw.config.public_metrics:
        refused = gw.check_key(request)
        if refused is not None:
            return refused
    return web.Response(body=gw.metrics.render(), content_type="text/plain", charset="utf-8")


async def session_token_handler(request: web.Request) -> web.Response:
    """Mint a short-lived single-use session token for a browser. Needs the API key when auth is on."""
    gw = request.app[GATEWAY]
    refused = gw.check_key(request)
    if refused is not None:
        return refused
    token, exp = gw.auth.mint()
    return web.json_response({"token": token, "expires_at": exp, "ttl_s": gw.auth.config.token_ttl_s})


# Query parameters whose values are credentials: never written to the access log.
_SECRET_QUERY = re.compile(r"(?i)\b(token|key|api_key|apikey|access_token)=[^&\s]*")


class AccessLogger(AbstractAccessLogger):
    """One line per request, with credentials in the query string masked (a session token or a
    key passed as ``?token=`` would otherwise sit in every log aggregator)."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        path = _SECRET_QUERY.sub(r"\1=***", request.path_qs)
        self.logger.info(
            "%s %s %s %d %d %.1fms",
            request.remote,
            request.method,
            path,
            response.status,
            response.body_length,
            time * 1000,
        )


def make_runner(app: web.Application) -> web.AppRunner:
    """The runner every server of this app uses (CLI and tests alike): masked access log and the
    header-read / keep-alive timeout."""
    config = app[GATEWAY].config
    return web.AppRunner(
        app,
        handle_signals=False,
        access_log_class=AccessLogger,
        keepalive_timeout=config.http_keepalive_s,
        # After an early answer (413, 408) aiohttp reads and drops the rest of the body so the
        # client sees the answer rather than a reset; 2 s bounds what a slow sender holds.
        lingering_time=2.0,
    )


async def drain(app: web.Application, timeout_s: float) -> None:
    """Refuse new sessions, let current turns finish (at most ``timeout_s``)."""
    gw = app[GATEWAY]
    gw.draining = True
    deadline = asyncio.get_running_loop().time() + timeout_s
    while any(s.open_turns for s in gw.sessions) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)


class EngineStartFailed(Exception):
    """The engine could not load or warm up; ``serve`` exits with this message."""


def _start_error(err: BaseException | None) -> str:
    """One line naming what failed: an engine core's message names its error's type already."""
    return str(err) if isinstance(err, CoreStartFailed) else f"{type(err).__name__}: {err}"


async def serve(config: GatewayConfig, group: EngineGroup | None = None) -> None:
    """Run until SIGTERM or SIGINT; then drain (no new sessions, current turns finish) and exit.
    ``group``: serve from these engine cores; None: an in-process engine of ``config.engine``.

    Raises EngineStartFailed if the model cannot load or warm up (after the port was opened)."""
    app = create_app(config, group=group)
    gw = app[GATEWAY]
    runner = make_runner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, config.host, config.port)
        await site.start()
        log.info("voicewire listening on http://%s:%d (model %s)", config.host, config.port, config.engine.model)
        print(
            f"voicewire: serving {config.engine.model} on http://{config.host}:{config.port} "
            "(ready once the model is warm: GET /readyz)",
            flush=True,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        start = gw.engine_start
        assert start is not None
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait([stopped, start], return_when=asyncio.FIRST_COMPLETED)  # type: ignore[type-var]
        if start.done() and start.exception() is not None:
            stopped.cancel()
            raise EngineStartFailed(_start_error(start.exception()))
        if not stop.is_set():
            log.info("engine ready")
            print("voicewire: ready", flush=True)
        await stopped
        log.info("draining: %d sessions open", len(gw.sessions))
        await drain(app, config.drain_timeout_s)
    finally:
        await runner.cleanup()
    log.info("stopped")
