"""One turn as the session sees it, and what a transport provides to speak it (``SessionSink``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from voicewire.engine import AudioChunk, Stream

from .protocol import G711_FORMATS, G711_RATE_HZ, TurnId
from .truncation import SpokenWord, TextAligner, TextSpan


@dataclass
class AudioSettings:
    format: str = "pcm16"
    sample_rate: int = 24_000
    voice: str = ""

    @property
    def rate_hz(self) -> int:
        """The rate the audio goes out at: G.711 is 8000 Hz by definition, whatever ``sample_rate`` says."""
        return G711_RATE_HZ if self.format in G711_FORMATS else self.sample_rate

    def describe(self) -> dict[str, Any]:
        return {"format": self.format, "sample_rate": self.rate_hz, "channels": 1}


@dataclass
class Turn:
    turn_id: TurnId
    stream: Stream
    audio: AudioSettings  # settings in force when the turn started
    t_first_text: float = field(default_factory=time.perf_counter)
    t_last_activity: float = field(default_factory=time.monotonic)  # last text in or audio out
    chars_in: int = 0  # text characters the client sent for this turn
    t_first_audio_sent: float | None = None
    first_audible_sample: int | None = None  # start of the turn's first 10 ms window above the onset level
    samples_sent: int = 0  # engine-rate samples handed to the transport
    text_sent: list[str] = field(default_factory=list)
    text_spans: list[TextSpan] = field(default_factory=list)  # where each chunk's text lies in the audio
    underruns: int = 0  # audio handed over after a listener (playing from the first audio) ran dry
    text_in: TextAligner = field(default_factory=TextAligner)  # the text the client sent, to place words in
    words: list[SpokenWord] = field(default_factory=list)  # timed words of the audio sent so far
    played_report_ms: float | None = None  # the client's playback position, from turn.cancel
    ended: bool = False
    cancelled: bool = False
    timed_out: bool = False  # ended by the session: no text and no audio for the idle time

    @property
    def finished_input(self) -> bool:
        return self.ended or self.cancelled


class SinkStalled(Exception):
    """Raised by a sink whose client stopped reading (a send made no progress for its stall timeout)."""


class SessionSink(Protocol):
    """What a transport provides to a session."""

    async def send_json(self, msg: dict[str, Any]) -> None: ...

    async def start_turn(self, turn: Turn) -> None: ...

    # What ``end_turn`` measures: "paced" (what left on the wall clock) or "sent" (what was written).
    played_source: str

    async def send_words(self, turn: Turn, words: list[SpokenWord]) -> None:
        """``turn.words`` for words that start in the next ``send_audio``'s chunk: sent no later
        than the audio holding each word's first sample."""
        ...

    async def send_audio(self, turn: Turn, chunk: AudioChunk) -> None: ...

    async def end_turn(self, turn: Turn, cancelled: bool) -> float:
        """Flush (or, cancelled, drop) the turn's queued audio; returns ms the client was given."""
        ...
