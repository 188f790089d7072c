"""Gateway configuration (frozen, validated once)."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine import EngineConfig


@dataclass(frozen=True)
class GatewayConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    engine: EngineConfig = field(default_factory=EngineConfig)
    ws_heartbeat_s: float = 20.0  # ping interval; a peer that misses a pong is closed
    max_http_body_bytes: int = 64 * 1024
    max_speech_input_chars: int = 4096  # the OpenAI speech API's own limit
    web_dir: str | None = None  # demo page; None = the bundled web/
