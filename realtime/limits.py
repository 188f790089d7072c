"""What one session, and one client, may do: the limits every transport enforces, each with a
documented error code (README, "Limits"), and the token bucket that meters rates."""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class SessionLimits:
    """Per-session limits; each breach has a documented error code (README, "Limits")."""

    # Turns open at once, the one playing included; each holds an engine stream, so a few
    # sessions cannot take every stream of the engine -> too_many_turns.
    max_open_turns: int = 4
    max_unspoken_chars: int = 20_000  # text sent and not yet spoken, over the open turns -> text_overflow
    text_chars_per_s: float = 1_000.0  # sustained text rate (an LLM at 100 tokens/s is ~400) -> rate_limited
    text_burst_chars: float = 10_000.0  # ...with this much allowed at once
    # text.delta messages: each is a command the engine's worker handles between its steps, so a
    # client sending a character a millisecond must not reach it a thousand times a second (a
    # token a delta at the text rate above is ~250/s) -> rate_limited
    deltas_per_s: float = 250.0
    delta_burst: float = 500.0
    # No client message and nothing playing -> close 4002. An open turn that got no text and
    # played no audio for this long ends with reason "timeout" and frees its engine stream.
    idle_timeout_s: float = 120.0
    max_lifetime_s: float = 3_600.0  # -> close 4001
    # Error replies: a burst, then a sustained rate; past it errors are counted, not sent, so
    # a flood of bad messages costs neither bandwidth nor log lines.
    error_burst: float = 100.0
    errors_per_s: float = 10.0


class TokenBucket:
    def __init__(self, rate_per_s: float, burst: float) -> None:
        self._rate, self._burst = rate_per_s, burst
        self._level, self._t = burst, time.monotonic()

    def take(self, amount: float) -> bool:
        now = time.monotonic()
        self._level = min(self._burst, self._level + (now - self._t) * self._rate)
        self._t = now
        if amount > self._level:
            return False
        self._level -= amount
        return True


MIN_SESSION_QUOTA = 8
MIN_SPEECH_QUOTA = 4


@dataclass(frozen=True)
class ClientQuotas:
    """Per-client limits; None: a quarter of the server's own limit (at least the floor above).
    0 turns a quota off."""

    max_sessions: int | None = None  # WebSocket + WebRTC sessions at once -> 429 quota_exceeded
    max_speech_requests: int | None = None  # speech requests streaming at once -> 429 quota_exceeded
    fair_share: bool = True  # engine streams: a fair share while others are active -> share_exceeded

    def __post_init__(self) -> None:
        for name in ("max_sessions", "max_speech_requests"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0 (0: no per-client limit), got {value}")

    def sessions(self, server_limit: int) -> int | None:
        return _quota(self.max_sessions, server_limit, MIN_SESSION_QUOTA)

    def speech_requests(self, server_limit: int) -> int | None:
        return _quota(self.max_speech_requests, server_limit, MIN_SPEECH_QUOTA)


def _quota(value: int | None, server_limit: int, floor: int) -> int | None:
    if value is None:
        return max(floor, server_limit // 4)
    return value or None
