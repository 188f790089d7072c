"""Gateway configuration (frozen, validated once)."""

from __future__ import annotations

from dataclasses import dataclass, field

from voicewire.engine import EngineConfig

from .auth import AuthConfig
from .limits import SessionLimits

ICE_URL_SCHEMES = ("stun:", "stuns:", "turn:", "turns:")


@dataclass(frozen=True)
class IceServer:
    """One STUN or TURN server offered to WebRTC peers (aiortc's RTCIceServer)."""

    urls: tuple[str, ...]
    username: str | None = None  # TURN only
    credential: str | None = None  # TURN only

    def __post_init__(self) -> None:
        if not self.urls or not all(u.startswith(ICE_URL_SCHEMES) for u in self.urls):
            raise ValueError(f"ICE server urls must start with one of {ICE_URL_SCHEMES}, got {self.urls}")


@dataclass(frozen=True)
class GatewayConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    engine: EngineConfig = field(default_factory=EngineConfig)
    ws_heartbeat_s: float = 20.0  # ping interval; a peer that misses a pong is closed
    max_http_body_bytes: int = 64 * 1024
    # A request's headers must arrive within this (aiohttp's keep-alive timer also runs from the
    # connection's start), and an idle keep-alive connection is closed after it: a slow-headers
    # client holds a socket this long at most. Shorter than uvicorn's 5 s would cut real clients.
    http_keepalive_s: float = 15.0
    http_body_timeout_s: float = 10.0  # a request body must arrive within this -> 408 body_timeout
    max_speech_requests: int = 64  # POST /v1/audio/speech streaming at once -> 503 too_many_requests
    public_metrics: bool = False  # GET /metrics without the API key when auth is on
    max_speech_input_chars: int = 4096  # the OpenAI speech API's own limit
    web_dir: str | None = None  # demo page; None = the bundled web/
    # WebRTC. No STUN/TURN by default: nothing leaves the host unless asked, and host candidates
    # reach a browser on the same machine or LAN.
    ice_servers: tuple[IceServer, ...] = ()
    # Host addresses aioice offers. None: this machine's, plus 127.0.0.1 when ``host`` is a loopback
    # address (aioice leaves loopback out, and a loopback-only container then offers no candidate).
    ice_host_addresses: tuple[str, ...] | None = None
    # ICE consent freshness (RFC 7675): how a peer that vanished without a goodbye (browser killed,
    # network gone) is found. A check every interval, 0.5 s timeout each; the call ends after this
    # many misses in a row: ~4 x 1.5 s = 6 s here, against aioice's 6 x 5.5 s = 33 s default.
    ice_consent_interval_s: float = 1.0
    ice_consent_failures: int = 4
    max_webrtc_peers: int = 64  # each peer holds ~4 UDP sockets, a track task and a session
    # ICE candidates one offer may carry (a browser sends a few per network interface): each is
    # a target of the server's connectivity checks -> 400 too_many_candidates.
    max_offer_candidates: int = 16
    # Security and limits (README, "Security and limits"). Auth is off unless API keys are set.
    auth: AuthConfig = field(default_factory=AuthConfig)
    limits: SessionLimits = field(default_factory=SessionLimits)
    max_sessions: int = 200  # sessions (WebSocket + WebRTC) per process -> 503 too_many_sessions
    write_stall_timeout_s: float = 10.0  # a client that stops reading this long is closed with 4008
    ws_send_buffer_bytes: int = 64 * 1024  # kernel send buffer per WebSocket: bounds memory per slow client
    drain_timeout_s: float = 10.0  # SIGTERM: how long current turns may take to finish
