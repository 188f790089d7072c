"""The state one gateway shares between its handlers, and the admission check every session passes.

One ``Gateway`` per aiohttp app (``app[GATEWAY]``): configuration, the engine, auth, metrics and
the run-time state (open sessions, WebRTC peers, draining). Run-time state lives in this object,
not in the app mapping, which aiohttp freezes once the app has started.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

from engine import Engine

from .auth import Authenticator, AuthError, api_key_from_headers
from .config import GatewayConfig
from .metrics import GatewayMetrics

if TYPE_CHECKING:
    from .session import Session

log = logging.getLogger("voicewire.gateway")


@dataclass
class Gateway:
    config: GatewayConfig
    engine: Engine
    auth: Authenticator
    metrics: GatewayMetrics
    sessions: set[Session] = field(default_factory=set)  # WebSocket and WebRTC sessions
    peers: set[Any] = field(default_factory=set)  # WebRTC peer connections (realtime.webrtc.WebRtcPeer)
    draining: bool = False  # SIGTERM: no new sessions, current turns finish

    @classmethod
    def create(cls, config: GatewayConfig, engine: Engine) -> Gateway:
        return cls(config, engine, Authenticator(config.auth), GatewayMetrics(engine))

    def refuse(self, request: web.Request, status: int, code: str, message: str) -> web.Response:
        """Refuse a session-opening request before anything is allocated for it."""
        self.metrics.errors.labels(code).inc()
        log.info("refused %s %s: %s", request.method, request.path, code)
        return web.json_response({"error": {"code": code, "message": message}}, status=status)

    def admit(self, request: web.Request, token: str | None) -> web.Response | None:
        """Draining, capacity, origin and credentials: a refusal response, or None to go ahead."""
        if self.draining:
            return self.refuse(request, 503, "draining", "the server is shutting down")
        if len(self.sessions) >= self.config.max_sessions:
            return self.refuse(request, 503, "too_many_sessions", "the server is at its session limit")
        try:
            self.auth.authorize(
                origin=request.headers.get("Origin"),
                api_key=api_key_from_headers(request.headers),
                token=token,
            )
        except AuthError as err:
            return self.refuse(request, err.status, err.code, err.message)
        return None


GATEWAY = web.AppKey("gateway", Gateway)
