"""Protocol v1's records on the client side: the audio, word timings and ``turn.done`` a turn
receives, the error a refusal raises, and the text of one LLM stream item (``delta_text``)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

DEFAULT_SAMPLE_RATE_HZ = 24_000
OPUS_FRAME_S = 0.020  # one Opus packet per binary message
TurnId = str | int


class VoicewireError(Exception):
    """The server answered with an error (``code`` as documented in README, protocol v1)."""

    def __init__(self, code: str, message: str, turn_id: TurnId | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.turn_id = turn_id


@dataclass(frozen=True)
class ReceivedAudio:
    """One binary audio message (WebSocket) or one decoded 20 ms frame (WebRTC)."""

    data: bytes  # pcm16: little-endian int16 mono; opus: one Opus packet; mulaw/alaw: G.711 bytes
    format: str  # "pcm16" | "opus" | "mulaw" | "alaw"
    sample_rate_hz: int
    t_received_s: float  # time.perf_counter() on arrival

    @property
    def duration_s(self) -> float:
        if self.format == "opus":
            return OPUS_FRAME_S
        bytes_per_sample = 1 if self.format in ("mulaw", "alaw") else 2
        return len(self.data) / bytes_per_sample / self.sample_rate_hz

    def pcm(self) -> np.ndarray:
        """The samples as int16 (pcm16 only: decode Opus with your player or PyAV)."""
        if self.format != "pcm16":
            raise ValueError(f"pcm() needs pcm16 audio, this is {self.format}")
        return np.frombuffer(self.data, "<i2")


@dataclass(frozen=True)
class WordTiming:
    """One spoken word of a turn (``turn.words``): where it lies in the turn's audio and in its text."""

    word: str  # the word as the voice speaks it (normalized: e.g. no emoji)
    start_ms: float  # from the turn's first audio sample
    end_ms: float
    char_start: int  # the word's span in the turn's text as sent (its text.delta texts joined)
    char_end: int

    @classmethod
    def from_message(cls, item: dict[str, Any]) -> WordTiming:
        return cls(
            word=str(item["word"]),
            start_ms=float(item["start_ms"]),
            end_ms=float(item["end_ms"]),
            char_start=int(item["char_start"]),
            char_end=int(item["char_end"]),
        )


@dataclass(frozen=True)
class TurnWords:
    """One ``turn.words`` message: words whose audio starts in the audio that follows it."""

    turn_id: TurnId
    words: tuple[WordTiming, ...]


TurnEvent = ReceivedAudio | TurnWords


@dataclass(frozen=True)
class TurnDone:
    """The server's ``turn.done``."""

    turn_id: TurnId
    reason: str  # "completed" | "cancelled" | "error" | "timeout" (idle) | "length" (a length guard cut it)
    audio_ms: float  # audio the server produced for the turn
    played_ms: float  # audio the listener heard, see played_source
    text_spoken: str  # the words up to played_ms (from the word timings)
    metrics: dict[str, Any] = field(default_factory=dict)  # ttfp_ms, ttfa_ms, engine_ttfp_ms, ...
    # what played_ms is: "client" (the client reported its playback position with turn.cancel,
    # before the end or after it: turn.truncated),
    # "paced" (WebRTC: what the server's pacer sent on the wall clock), "sent" (WebSocket: audio sent)
    played_source: str = "sent"

    @classmethod
    def from_message(cls, msg: dict[str, Any]) -> TurnDone:
        return cls(
            turn_id=msg["turn_id"],
            reason=str(msg.get("reason", "")),
            audio_ms=float(msg.get("audio_ms", 0.0)),
            played_ms=float(msg.get("played_ms", 0.0)),
            text_spoken=str(msg.get("text_spoken", "")),
            metrics=dict(msg.get("metrics") or {}),
            played_source=str(msg.get("played_source", "sent")),
        )

    def truncated(self, msg: dict[str, Any]) -> TurnDone:
        """This account at the position a later ``turn.truncated`` gives: the turn ended on the
        server (``reason`` stays), the listener heard ``played_ms`` of it, which spoke ``text_spoken``."""
        return replace(
            self,
            played_ms=float(msg.get("played_ms", self.played_ms)),
            text_spoken=str(msg.get("text_spoken", self.text_spoken)),
            played_source=str(msg.get("played_source", "client")),
        )


@dataclass(frozen=True)
class TurnAudio:
    """A whole turn as it was received: its audio messages in order of arrival, and its ``turn.done``."""

    chunks: tuple[ReceivedAudio, ...]
    done: TurnDone
    words: tuple[WordTiming, ...] = ()  # every word the server timed for the turn, in order

    @property
    def data(self) -> bytes:
        return b"".join(c.data for c in self.chunks)

    @property
    def arrival_times_s(self) -> list[float]:
        return [c.t_received_s for c in self.chunks]

    def pcm(self) -> np.ndarray:
        """The samples as float32 in [-1, 1] (pcm16 only)."""
        if not self.chunks:
            return np.zeros(0, np.float32)
        return np.concatenate([c.pcm() for c in self.chunks]).astype(np.float32) / 32768.0


def delta_text(delta: Any) -> str:
    """Text of one LLM stream item: a str, or an OpenAI-style chunk (object or dict) whose
    ``choices[0].delta.content`` holds it. Items without text (role-only deltas, the final usage
    chunk with no choices, tool calls) give ""."""
    if isinstance(delta, str):
        return delta
    if delta is None:
        return ""
    choices = delta.get("choices") if isinstance(delta, dict) else getattr(delta, "choices", None)
    if not choices:
        return ""
    first = choices[0]
    inner = first.get("delta") if isinstance(first, dict) else getattr(first, "delta", None)
    if inner is None:
        return ""
    content = inner.get("content") if isinstance(inner, dict) else getattr(inner, "content", None)
    return content if isinstance(content, str) else ""
