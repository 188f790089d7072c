"""Gateway configuration (frozen, validated once)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from voicewire.engine import EngineConfig

from .auth import AuthConfig
from .limits import ClientQuotas, SessionLimits
from .reference_audio import ReferenceLimits

ICE_URL_SCHEMES = ("stun:", "stuns:", "turn:", "turns:")
MIN_SESSIONS = 200  # the default session limit's floor: sessions between turns hold no stream


@dataclass(frozen=True)
class IceServer:
    """One STUN or TURN server offered to WebRTC peers (aiortc's RTCIceServer)."""

    urls: tuple[str, ...]
    username: str | None = None  # TURN only
    credential: str | None = None  # TURN only

    def __post_init__(self) -> None:
        if not self.urls or not all(u.startswith(ICE_URL_SCHEMES) for u in self.urls):
            raise ValueError(f"ICE server urls must start with one of {ICE_URL_SCHEMES}, got {self.urls}")
        # aiortc parses the urls only when a call's ICE gatherer is made: a malformed one would
        # fail every offer. Parsed here, with its own parser, it fails the start instead.
        from aiortc.rtcicetransport import parse_stun_turn_uri

        for url in self.urls:
            try:
                parse_stun_turn_uri(url)
            except ValueError:
                raise ValueError(
                    f"malformed ICE server url {url!r} (e.g. stun:host:3478, turn:host:3478?transport=udp)"
                ) from None
        turn = any(u.startswith(("turn:", "turns:")) for u in self.urls)
        if turn and (not self.username or not self.credential):
            # A browser refuses the whole RTCConfiguration (InvalidAccessError) for a TURN url
            # without both, so the page could not connect at all.
            raise ValueError(f"a TURN server needs a username and a credential: {self.urls}")

    def as_rtc(self) -> dict[str, object]:
        """The browser's RTCIceServer dictionary."""
        out: dict[str, object] = {"urls": list(self.urls)}
        if self.username is not None:
            out["username"] = self.username
        if self.credential is not None:
            out["credential"] = self.credential
        return out


def normalize_base_path(path: str) -> str:
    """``/voice``, ``voice/`` -> ``/voice``; ``/`` and empty -> empty (served at the root)."""
    parts = [p for p in path.strip().split("/") if p]
    if any(p in (".", "..") or not all(c.isalnum() or c in "-_.~" for c in p) for p in parts):
        raise ValueError(f"a base path is /-separated names of letters, digits and -_.~, got {path!r}")
    return "".join(f"/{p}" for p in parts)


def parse_networks(values: tuple[str, ...]) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """``127.0.0.1``, ``10.0.0.0/8``, ``::1`` -> networks (a bare address is a /32 or /128)."""
    try:
        return tuple(ipaddress.ip_network(v.strip(), strict=False) for v in values)
    except ValueError as err:
        raise ValueError(f"a trusted proxy is an IP address or a network: {err}") from None


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
    # POST /v1/audio/speech streaming at once -> 503 too_many_requests. None: as many as the engines
    # run and queue, so a refusal means the engine is full, not that a number was reached
    max_speech_requests: int | None = None
    public_metrics: bool = False  # GET /metrics without the API key when auth is on
    max_speech_input_chars: int = 4096  # the OpenAI speech API's own limit
    web_dir: str | None = None  # demo page; None = the bundled web/
    # Every route (the page, its assets, the WebSocket, /offer, speech, probes) lives under this
    # prefix: "/voice" behind a proxy that passes /voice/... through unchanged. Empty: the root.
    base_path: str = ""
    # Peers whose X-Forwarded-For/-Proto/-Host are believed (addresses or networks). Empty: none,
    # so a client cannot choose the address that logs and refusals name.
    trusted_proxies: tuple[str, ...] = ()
    # TLS on the gateway's own port (a proxy-less deployment): PEM certificate chain and key.
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    # WebRTC. No STUN/TURN by default: nothing leaves the host unless asked, and host candidates
    # reach a browser on the same machine or LAN.
    ice_servers: tuple[IceServer, ...] = ()
    # With auth on, where the demo page asks for a session token: an endpoint of the operator's
    # backend that holds the API key and calls POST /v1/session-tokens (deploy/token_backend.py).
    # The page POSTs to it with its cookies and reads {"token"}. None: the page says it has none.
    demo_token_url: str | None = None
    # Host addresses aioice offers. None: this machine's, plus 127.0.0.1 when ``host`` is a loopback
    # address (aioice leaves loopback out, and a loopback-only container then offers no candidate).
    ice_host_addresses: tuple[str, ...] | None = None
    # ICE consent freshness (RFC 7675): how a peer that vanished without a goodbye (browser killed,
    # network gone) is found. A check every interval, 0.5 s timeout each; the call ends after this
    # many misses in a row: ~4 x 1.5 s = 6 s here, against aioice's 6 x 5.5 s = 33 s default.
    ice_consent_interval_s: float = 1.0
    ice_consent_failures: int = 4
    max_webrtc_peers: int = 64  # each peer holds ~4 UDP sockets, a track task and a session
    # ICE candidates one offer may carry: each is a target of the server's connectivity checks
    # -> 400 too_many_candidates. A browser sends them per media section, interface and kind:
    # Chromium with two interfaces (IPv4 + IPv6 each) offered 16 with no ICE server and 20 with
    # one STUN server (tests/deploy), before any TURN relay candidate.
    max_offer_candidates: int = 32
    # Security and limits (README, "Security and limits"). Auth is off unless API keys are set.
    auth: AuthConfig = field(default_factory=AuthConfig)
    limits: SessionLimits = field(default_factory=SessionLimits)
    quotas: ClientQuotas = field(default_factory=ClientQuotas)  # one client's share (quotas.py)
    # sessions (WebSocket + WebRTC) per process -> 503 too_many_sessions; None: as many as the
    # engines have streams, and at least MIN_SESSIONS (a GPU engine with 512 streams must not be
    # capped by a limit made for a CPU voice)
    max_sessions: int | None = None
    write_stall_timeout_s: float = 10.0  # a client that stops reading this long is closed with 4008
    # kernel send buffer per WebSocket and streamed speech response: bounds memory per slow client,
    # and lets a proxy's buffering be seen (nothing hides megabytes in the gateway's own socket)
    send_buffer_bytes: int = 64 * 1024
    drain_timeout_s: float = 10.0  # SIGTERM: how long current turns may take to finish
    # Cloned voices (voices.py): persisted here and loaded at start; None keeps them in memory only
    # (``voicewire serve`` passes --voices-dir, by default under the user's data directory).
    voices_dir: str | None = None
    voice_limits: ReferenceLimits = field(default_factory=ReferenceLimits)  # what an upload may be
    # Other gateway processes serve this port (SO_REUSEPORT: `serve --workers`, `gateway --workers`):
    # what they share (the cloned voices) is read from disk, not kept as this process saw it.
    shared_port: bool = False
    # The directory those processes share (gateway_procs.py): spent session tokens, each client's
    # sessions and speech requests (peer_holds.py), and a socket each through which one /metrics
    # answers for all (peer_metrics.py). None: this process alone.
    peers_dir: str | None = None

    def __post_init__(self) -> None:
        if self.base_path != normalize_base_path(self.base_path):
            raise ValueError(
                f"base_path must be normalized ({normalize_base_path(self.base_path)!r}), got {self.base_path!r}"
            )
        parse_networks(self.trusted_proxies)
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("TLS needs both a certificate and a key file")
