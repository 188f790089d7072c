"""The state one gateway shares between its handlers, and the admission check every session passes.

One ``Gateway`` per aiohttp app (``app[GATEWAY]``): configuration, the engine replicas, auth,
metrics and the run-time state (open sessions, WebRTC peers, draining). Run-time state lives in
this object, not in the app mapping, which aiohttp freezes once the app has started.

Replicas: an in-process ``Engine`` (one), or the ``CoreClient`` of each engine core of an
``EngineGroup``. A session is given one replica when it is created and every turn of it goes
there; a speech request picks one per request. The pick is the ready replica with the most free
streams, then the fewest sessions.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias, cast

from aiohttp import web

from voicewire.engine import Engine
from voicewire.engine.core import CoreClient, EngineGroup
from voicewire.engine.loop_lag import LoopLag

from .auth import Authenticator, AuthError, api_key_from_headers, token_from_request
from .config import MIN_SESSIONS, GatewayConfig
from .log_limit import LogLimiter
from .metrics import GatewayMetrics
from .peer_holds import PeerHolds
from .proxy import client_address
from .quotas import Client, ClientLedger, StreamShare, client_id
from .voices import VoiceStore

if TYPE_CHECKING:
    from .session import Session

log = logging.getLogger("voicewire.gateway")

Replica: TypeAlias = Engine | CoreClient


@dataclass
class Gateway:
    config: GatewayConfig
    engines: list[Replica]  # one in-process engine, or one client per engine core
    auth: Authenticator
    metrics: GatewayMetrics
    sessions: set[Session] = field(default_factory=set)  # WebSocket and WebRTC sessions
    peers: set[Any] = field(default_factory=set)  # WebRTC peer connections (realtime.webrtc.WebRtcPeer)
    draining: bool = False  # SIGTERM: no new sessions, current turns finish
    speech_requests: int = 0  # POST /v1/audio/speech requests streaming now
    engine_start: asyncio.Future[Any] | None = None  # the background start of the engine(s) the app owns
    log_limiter: LogLimiter = field(default_factory=LogLimiter)  # refusals and client errors
    group: EngineGroup | None = None  # the engine cores, when the engine runs out of process
    voices: VoiceStore = field(default_factory=VoiceStore)  # cloned voices (voices_api.py)
    clients: ClientLedger = field(default_factory=ClientLedger)  # what each client holds (quotas.py)
    # with other processes on the port: each client's sessions and speech requests over all of them
    peer_holds: PeerHolds | None = None
    loop_lag: LoopLag = field(default_factory=LoopLag)  # this process's loop, watched once ready (serve)

    @classmethod
    def create(cls, config: GatewayConfig, engine: Engine | EngineGroup) -> Gateway:
        # A group's own list: Ray's cores come and go (engine/core/ray_group.py)
        engines: list[Replica] = engine.replicas if isinstance(engine, EngineGroup) else [engine]  # type: ignore[assignment]
        group = engine if isinstance(engine, EngineGroup) else None
        voices = VoiceStore(config.voices_dir, shared=config.shared_port)
        voices.load()  # small files (a few KB a voice): read before the port opens
        gw = cls(config, engines, Authenticator(config.auth), GatewayMetrics(engines), group=group, voices=voices)
        if config.peers_dir is not None:
            gw.peer_holds = PeerHolds(config.peers_dir)
        gw.metrics.watch_clients(gw.clients)
        gw.metrics.watch_process(gw.loop_lag)
        return gw

    @property
    def engine(self) -> Replica:
        """The first replica: what every replica shares (the model's info, its config)."""
        return self.engines[0]

    @property
    def ready(self) -> bool:
        """Every replica is warm and stepping (what /readyz says); with cores found through Ray,
        some core is (the others' states are in /readyz)."""
        return self.group.ready if self.group is not None else all(e.ready for e in self.engines)

    def pick_engine(self) -> Engine:
        """The replica a new session or speech request goes to: ready first, then the most free
        streams, then the fewest sessions."""
        engine = self.engines[0]
        if len(self.engines) > 1:
            sessions = Counter(id(s.engine) for s in self.sessions)
            engine = max(self.engines, key=lambda e: (e.ready, _free_streams(e), -sessions[id(e)]))
        # Session and the speech handler are typed against Engine; a CoreClient has every part of
        # it they use (open_stream, info, ready, onset_threshold_dbfs).
        return cast(Engine, engine)

    def session_limit(self) -> int:
        if self.config.max_sessions is not None:
            return self.config.max_sessions
        return max(MIN_SESSIONS, self.stream_capacity())

    def speech_limit(self) -> int:
        if self.config.max_speech_requests is not None:
            return self.config.max_speech_requests
        return self.stream_capacity() + sum(e.config.max_queued_streams for e in self.engines if e.ready)

    def refuse(self, request: web.Request, status: int, code: str, message: str) -> web.Response:
        """Refuse a request before anything is allocated for it."""
        self.metrics.errors.labels(code).inc()
        # The client as a trusted proxy names it (realtime/proxy.py), so a refused browser behind
        # the proxy is told apart from the proxy itself.
        self.log_limiter.log(
            log, "refused %s %s from %s: %s", request.method, request.path, client_address(request), code, key=code
        )
        return error_response(status, code, message)

    def admit(self, request: web.Request, *, opens_session: bool, json_body: bool = False) -> web.Response | None:
        """The one admission path of every request that can spend engine time or hold a session
        (WebSocket, WebRTC offer, speech): a refusal response, or None to go ahead.

        Origin first (a foreign page learns nothing else), then credentials: a session token is
        spent here, whatever follows, so a token seen on a refused request (draining, readiness,
        capacity, media type) can never be replayed; then that state, then the body's media
        type. ``json_body``: the request must say ``application/json``; a browser cannot send
        that cross-origin without a CORS preflight, which this server never grants.
        """
        try:
            self.auth.check_origin(request.headers.get("Origin"))
            self.auth.authorize(
                api_key=api_key_from_headers(request.headers),
                token=token_from_request(request.query, request.headers),
            )
        except AuthError as err:
            return self.refuse(request, err.status, err.code, err.message)
        if self.draining:
            return self.refuse(request, 503, "draining", "the server is shutting down")
        if not any(e.ready for e in self.engines):
            return self.refuse(request, 503, "not_ready", "the engine is starting; retry shortly")
        if opens_session and len(self.sessions) >= self.session_limit():
            return self.refuse(request, 503, "too_many_sessions", "the server is at its session limit")
        if json_body and request.content_type != "application/json":
            return self.refuse(
                request, 415, "unsupported_media_type", "send the body as Content-Type: application/json"
            )
        return None

    def take_client(self, request: web.Request, *, session: bool = False, speech: bool = False) -> Client | web.Response:
        """After ``admit``: the request's client, now holding one more session or speech request
        (give it back with ``give_client``); or the 429 ``quota_exceeded`` to answer."""
        client = self.clients.get(client_id(request, self.auth.config.enabled))
        quotas = self.config.quotas
        if session:
            held, quota = client.sessions, quotas.sessions(self.session_limit())
            what, kind = "sessions", "sessions"
        else:
            held, quota = client.speech_requests, quotas.speech_requests(self.speech_limit())
            what, kind = "speech requests", "speech"
        if quota is not None and not self._hold(client, kind, held, quota):
            self.clients.release(client)
            self.metrics.quota_refusals.labels(kind).inc()
            resp = self.refuse(request, 429, "quota_exceeded", f"a client may hold at most {quota} {what} at once")
            resp.headers["Retry-After"] = "1"
            return resp
        if session:
            client.sessions += 1
        if speech:
            client.speech_requests += 1
        return client

    def _hold(self, client: Client, kind: str, held: int, quota: int) -> bool:
        """One more of ``kind`` for ``client`` within ``quota``: as this process counts, or over every
        process of the port."""
        if self.peer_holds is None:
            return held < quota
        hold = self.peer_holds.take(client.id, kind, quota)
        if hold is not None:
            client.peer_holds.setdefault(kind, []).append(hold)
        return hold is not None

    def give_client(self, client: Client, *, session: bool = False, speech: bool = False) -> None:
        if session:
            client.sessions -= 1
        if speech:
            client.speech_requests -= 1
        for kind, given in (("sessions", session), ("speech", speech)):
            if given and client.peer_holds.get(kind):
                PeerHolds.give(client.peer_holds[kind].pop())
        self.clients.release(client)

    def stream_share(self, client: Client) -> StreamShare:
        """The stream share a session or speech request of ``client`` opens its streams through."""
        return StreamShare(self.clients, client, self.stream_capacity, self.config.quotas.fair_share)

    def stream_capacity(self) -> int:
        return sum(_stream_capacity(e) for e in self.engines)

    def check_key(self, request: web.Request) -> web.Response | None:
        """Endpoints for operators and backends (token minting, metrics): the API key, no token."""
        try:
            self.auth.check_origin(request.headers.get("Origin"))
            if self.auth.config.enabled:
                self.auth.check_api_key(api_key_from_headers(request.headers))
        except AuthError as err:
            return self.refuse(request, err.status, err.code, err.message)
        return None


def _stream_capacity(engine: Replica) -> int:
    """Streams a replica runs at once (both limits are already capped by the model's slots)."""
    if not engine.ready:
        return 0
    return engine.max_streams if isinstance(engine, CoreClient) else engine.stream_limit


def _free_streams(engine: Replica) -> int:
    """As the core reports it where other gateways share it (CoreClient.free_streams)."""
    if isinstance(engine, CoreClient):
        return engine.free_streams()
    return _stream_capacity(engine) - engine.active_streams() if engine.ready else 0


def bound_send_buffer(request: web.Request, nbytes: int) -> None:
    """Bounded kernel buffering for one client's connection: a reader that stops is noticed in
    seconds (the write stall timeout), not after megabytes."""
    sock = request.transport.get_extra_info("socket") if request.transport else None
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, nbytes)


def error_body(status: int, code: str, message: str) -> dict[str, Any]:
    """The JSON error every HTTP endpoint answers with (the OpenAI API's shape)."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"type": kind, "code": code, "message": message}}


def error_response(status: int, code: str, message: str) -> web.Response:
    return web.json_response(error_body(status, code, message), status=status)


class RequestError(Exception):
    """A request refused with a 4xx/5xx status and a stable code (body, offer and speech checks)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    def response(self) -> web.Response:
        resp = error_response(self.status, self.code, self.message)
        if self.status in (408, 413):
            # The rest of the body is still on the wire: close instead of lingering to read it.
            resp.force_close()
        return resp


GATEWAY = web.AppKey("gateway", Gateway)
