"""The gateway application: one aiohttp app serving the WebSocket, HTTP and the demo page.

Start-up an orchestrator can trust: the port opens at once and ``/healthz`` answers while the
engine loads and warms up (tens of seconds for Qwen3-TTS graph capture) in the background;
``/readyz`` is 503 until the engine's worker runs, and requests that need the engine get 503
``not_ready`` until then.

The engine runs in the gateway's process (an ``Engine``) or out of it, as a supervised group of
engine-core processes (an ``EngineGroup``, one per replica); then ``/readyz`` is 200 only while
every replica is warm and running, and it says each replica's state.

Deployment knobs (README, "Deploying"): every route lives under ``config.base_path``; the demo
page finds its own base from the URL it was loaded from and asks ``/v1/rtc-configuration`` for the
ICE servers its ``RTCPeerConnection`` uses (the same ones the server's aiortc peers use);
``X-Forwarded-*`` headers are believed from ``config.trusted_proxies`` only; TLS on the port
itself with a certificate and key.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import ssl
from pathlib import Path

from aiohttp import web
from aiohttp.log import server_logger

from voicewire.engine import Engine, heap
from voicewire.engine.core import CoreStartFailed, CoreState, EngineGroup

from .auth import AuthError
from .config import GatewayConfig
from .gateway import GATEWAY, Gateway
from .http_api import healthz_handler, models_handler, speech_handler
from .http_log import RequestErrorLog, access_logger
from .peer_metrics import render_all, serve_own
from .proxy import trusted_proxy_middleware
from .request_body import request_body_middleware
from .voices_api import add_voice_routes
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
    # The proxy's first: every later step (refusals, logs) names the forwarded client.
    middlewares = [trusted_proxy_middleware(config.trusted_proxies)] if config.trusted_proxies else []
    middlewares.append(request_body_middleware)
    app = web.Application(client_max_size=config.max_http_body_bytes, middlewares=middlewares)
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
                if gw.group is not None and gw.group.start_cancellable:
                    gw.engine_start.cancel()  # cores found through Ray: it may wait for them forever
                await asyncio.gather(gw.engine_start, return_exceptions=True)  # close after start
            if gw.group is not None:
                await gw.group.close()
            else:
                await asyncio.get_running_loop().run_in_executor(None, gw.engines[0].close)

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)
    app.on_cleanup.append(on_cleanup)
    base = config.base_path  # "" or "/voice": every route below lives under it
    app.router.add_get(f"{base}/v1/stream", stream_handler)
    app.router.add_post(f"{base}/v1/audio/speech", speech_handler)
    app.router.add_get(f"{base}/healthz", healthz_handler)
    app.router.add_get(f"{base}/health", healthz_handler)  # the name benchmark harnesses probe
    app.router.add_get(f"{base}/v1/models", models_handler)
    add_voice_routes(app, base)  # /v1/audio/voices: list, upload; /v1/audio/voices/{voice}: get, delete
    app.router.add_get(f"{base}/readyz", readyz_handler)
    app.router.add_get(f"{base}/metrics", metrics_handler)
    app.router.add_post(f"{base}/v1/session-tokens", session_token_handler)
    app.router.add_get(f"{base}/v1/rtc-configuration", rtc_configuration_handler)
    setup_webrtc(app, base)  # POST /offer; closes its peers on shutdown
    web_dir = Path(config.web_dir) if config.web_dir else WEB_DIR
    if (web_dir / "index.html").exists():
        index = web_dir / "index.html"

        async def index_handler(request: web.Request) -> web.FileResponse:
            return web.FileResponse(index)

        app.router.add_get(f"{base}/", index_handler)
        if base:
            # The page loads its assets relative to its own URL, so /voice must become /voice/.
            async def to_index(request: web.Request) -> web.Response:
                raise web.HTTPPermanentRedirect(f"{base}/")

            app.router.add_get(base, to_index)
        app.router.add_static(f"{base}/static/", web_dir)
    return app


def _log_engine_start(task: asyncio.Future[object]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("the engine failed to start: %s", task.exception())


async def readyz_handler(request: web.Request) -> web.Response:
    """Ready to take sessions: every replica is warm and its worker runs, and the server is not
    draining. With engine cores, ``replicas`` says each one's state (a restarting replica makes
    the gateway not ready until it is back)."""
    gw = request.app[GATEWAY]
    # the gateway's pid too: behind one port (--workers, a balancer) it says which process answered
    extra = {"replicas": gw.group.describe(), "gateway_pid": os.getpid()} if gw.group is not None else {}
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
    body = gw.metrics.render()
    if gw.config.peers_dir is not None:  # other processes serve this port: one answer for all
        body = await render_all(gw.config.peers_dir, body)
    return web.Response(body=body, content_type="text/plain", charset="utf-8")


async def rtc_configuration_handler(request: web.Request) -> web.Response:
    """The RTCConfiguration a browser passes to ``new RTCPeerConnection``: the ICE servers the
    server's own peers use; and for the demo page, whether it needs a session token and the
    operator's endpoint that mints one (``--demo-token-url``). Open like the page itself (Origin-checked, no credentials: a page
    must have it before it can connect, and a session token is single-use), so TURN credentials
    served here reach anyone who can load the page (README, "Deploying")."""
    gw = request.app[GATEWAY]
    try:
        gw.auth.check_origin(request.headers.get("Origin"))
    except AuthError as err:
        return gw.refuse(request, err.status, err.code, err.message)
    return web.json_response(
        {
            "iceServers": [s.as_rtc() for s in gw.config.ice_servers],
            # the demo page's own needs: whether it must bring a session token, and where to ask
            "authRequired": gw.auth.config.enabled,
            "tokenUrl": gw.config.demo_token_url,
        },
        headers={"Cache-Control": "no-store"},
    )


async def session_token_handler(request: web.Request) -> web.Response:
    """Mint a short-lived single-use session token for a browser. Needs the API key when auth is on."""
    gw = request.app[GATEWAY]
    refused = gw.check_key(request)
    if refused is not None:
        return refused
    token, exp = gw.auth.mint()
    return web.json_response({"token": token, "expires_at": exp, "ttl_s": gw.auth.config.token_ttl_s})


def make_runner(app: web.Application) -> web.AppRunner:
    """The runner every server of this app uses (CLI and tests alike): the masked, rate-limited
    access log and request-error log (http_log.py), bodies as they arrive, and the header-read /
    keep-alive timeout."""
    gw = app[GATEWAY]
    config = gw.config
    return web.AppRunner(
        app,
        handle_signals=False,
        access_log_class=access_logger(gw.log_limiter),
        logger=RequestErrorLog(server_logger, gw.log_limiter),
        # Encoded bodies are refused (request_body.py); nothing is inflated, not even a refused one.
        auto_decompress=False,
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


def tls_context(config: GatewayConfig) -> ssl.SSLContext | None:
    """The server's TLS context, or None for plain HTTP. TLS 1.2 or later (Python's default
    server context), so browsers get what they accept and nothing they have retired."""
    if config.tls_cert_file is None or config.tls_key_file is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(config.tls_cert_file, config.tls_key_file)
    return context


async def serve(config: GatewayConfig, group: EngineGroup | None = None, *, reuse_port: bool = False) -> None:
    """Run until SIGTERM or SIGINT; then drain (no new sessions, current turns finish) and exit.
    ``group``: serve from these engine cores; None: an in-process engine of ``config.engine``.
    ``reuse_port``: share the port with other gateway processes (SO_REUSEPORT: the kernel spreads
    connections over them; ``voicewire gateway --workers N``).

    Raises EngineStartFailed if the model cannot load or warm up (after the port was opened);
    ssl.SSLError / OSError if the TLS certificate or key cannot be loaded (before)."""
    tls = tls_context(config)
    app = create_app(config, group=group)
    gw = app[GATEWAY]
    runner = make_runner(app)
    await runner.setup()
    frozen = False
    peers: web.AppRunner | None = None
    try:
        site = web.TCPSite(runner, config.host, config.port, ssl_context=tls, reuse_port=reuse_port or None)
        await site.start()
        url = f"{'https' if tls else 'http'}://{config.host}:{config.port}{config.base_path}/"
        log.info("voicewire listening on %s (model %s)", url, config.engine.model)
        print(
            f"voicewire: serving {config.engine.model} on {url} "
            f"(ready once the model is warm: GET {config.base_path}/readyz)",
            flush=True,
        )
        if config.peers_dir is not None:
            peers = await serve_own(config.peers_dir, gw.metrics.render)
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
            if config.engine.freeze_heap:
                # the gateway's own startup heap (aiohttp, aiortc, PyAV) out of its collections, as
                # the engine's (heap.py): a full one stops the loop that paces every peer's packets
                heap.freeze()
                frozen = True
            heap.PAUSES.install()
            heap.PAUSES.mark()  # start-up's collections (the freeze's own) are no listener's wait
            gw.loop_lag.start()
        await stopped
        log.info("draining: %d sessions open", len(gw.sessions))
        await drain(app, config.drain_timeout_s)
    finally:
        gw.loop_lag.stop()
        if peers is not None:
            await peers.cleanup()
        await runner.cleanup()
        if frozen:
            heap.release()
    log.info("stopped")
