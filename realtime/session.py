"""The transport-agnostic session core: protocol v1 messages in, turns spoken in order.

A ``Session`` owns a client's turns. Text deltas open an engine stream per turn at once (so a
later turn's audio is generated while an earlier one plays), but audio leaves strictly in turn
order through one pump task. Transports (WebSocket, WebRTC data channel + audio track) are thin
``SessionSink`` adapters: they send JSON, turn PCM into their wire format, and report how much of
a turn the client has been given.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine import AudioChunk, Engine, EngineBusy, Stream, StreamError
from engine.level import first_audible_sample

from .metrics import GatewayMetrics
from .protocol import (
    MAX_MESSAGE_BYTES,
    MAX_TEXT_CHARS,
    PROTOCOL_VERSION,
    ProtocolError,
    SessionUpdate,
    TextDelta,
    TextEnd,
    TextFlush,
    TurnCancel,
    TurnId,
    error_message,
    parse_client_message,
)
from .truncation import TextSpan, spoken_text

log = logging.getLogger("voicewire.session")

MAX_REMEMBERED_TURNS = 256  # finished turn ids kept to reject late text for them


@dataclass(frozen=True)
class SessionLimits:
    """Per-session limits; each breach has a documented error code (README, "Limits")."""

    max_queued_turns: int = 8  # turns waiting behind the one playing -> too_many_turns
    text_chars_per_s: float = 1_000.0  # sustained text rate (an LLM at 100 tokens/s is ~400) -> rate_limited
    text_burst_chars: float = 10_000.0  # ...with this much allowed at once
    idle_timeout_s: float = 120.0  # no client message and nothing playing -> close 4002
    max_lifetime_s: float = 3_600.0  # -> close 4001


class _TokenBucket:
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


@dataclass
class AudioSettings:
    format: str = "pcm16"
    sample_rate: int = 24_000
    voice: str = ""

    def describe(self) -> dict[str, Any]:
        return {"format": self.format, "sample_rate": self.sample_rate, "channels": 1}


@dataclass
class Turn:
    turn_id: TurnId
    stream: Stream
    audio: AudioSettings  # settings in force when the turn started
    t_first_text: float = field(default_factory=time.perf_counter)
    t_first_audio_sent: float | None = None
    first_audible_sample: int | None = None  # start of the turn's first 10 ms window above the onset level
    samples_sent: int = 0  # engine-rate samples handed to the transport
    text_sent: list[str] = field(default_factory=list)
    text_spans: list[TextSpan] = field(default_factory=list)  # where each chunk's text lies in the audio
    underruns: int = 0  # audio handed over after a listener (playing from the first audio) ran dry
    ended: bool = False
    cancelled: bool = False

    @property
    def finished_input(self) -> bool:
        return self.ended or self.cancelled


class SinkStalled(Exception):
    """Raised by a sink whose client stopped reading (a send made no progress for its stall timeout)."""


class SessionSink(Protocol):
    """What a transport provides to a session."""

    async def send_json(self, msg: dict[str, Any]) -> None: ...

    async def start_turn(self, turn: Turn) -> None: ...

    async def send_audio(self, turn: Turn, chunk: AudioChunk) -> None: ...

    async def end_turn(self, turn: Turn, cancelled: bool) -> float:
        """Flush (or, cancelled, drop) the turn's queued audio; returns ms the client was given."""
        ...


class Session:
    def __init__(
        self,
        engine: Engine,
        sink: SessionSink,
        session_id: str,
        limits: SessionLimits | None = None,
        metrics: GatewayMetrics | None = None,
        transport: str = "websocket",
    ) -> None:
        self.engine = engine
        self.sink = sink
        self.session_id = session_id
        self.limits = limits or SessionLimits()
        self.metrics = metrics
        self.transport = transport
        self.audio = AudioSettings()
        self.t_started = time.monotonic()
        self.t_last_input = self.t_started
        self._text_bucket = _TokenBucket(self.limits.text_chars_per_s, self.limits.text_burst_chars)
        self._turns: dict[TurnId, Turn] = {}
        self._order: deque[Turn] = deque()
        self._finished: deque[TurnId] = deque()
        self._finished_set: set[TurnId] = set()
        self._wake = asyncio.Event()
        self._pump: asyncio.Task[None] | None = None
        self._closed = False
        self.turns_completed = 0
        self.slow_consumer = False  # the sink stalled: the transport closes the session

    # --- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        await self.sink.send_json(
            {
                "type": "session.created",
                "session_id": self.session_id,
                "protocol": PROTOCOL_VERSION,
                "audio": self.audio.describe(),
                "voices": list(self.engine.model.info.voices),
                "limits": {
                    "max_message_bytes": MAX_MESSAGE_BYTES,
                    "max_text_chars": MAX_TEXT_CHARS,
                    "max_queued_turns": self.limits.max_queued_turns,
                    "text_chars_per_s": self.limits.text_chars_per_s,
                    "idle_timeout_s": self.limits.idle_timeout_s,
                    "max_lifetime_s": self.limits.max_lifetime_s,
                },
            }
        )
        self._pump = asyncio.create_task(self._run_pump(), name=f"pump-{self.session_id}")

    async def close(self) -> None:
        """Client gone: cancel every turn and free its engine streams now."""
        if self._closed:
            return
        self._closed = True
        for turn in self._turns.values():
            turn.stream.cancel()
        if self._pump is not None:
            self._pump.cancel()
            try:
                await self._pump
            except (asyncio.CancelledError, Exception):
                pass

    @property
    def open_turns(self) -> int:
        return len(self._turns)

    def expired(self, now: float) -> str | None:
        """Why the transport should close this session now (lifetime, idle), or None."""
        if now - self.t_started > self.limits.max_lifetime_s:
            return "session_expired"
        if not self._turns and now - self.t_last_input > self.limits.idle_timeout_s:
            return "idle_timeout"
        return None

    def _ids(self, turn_id: TurnId | None = None) -> dict[str, Any]:
        """Structured log fields (``--log-format json`` prints them)."""
        return {"session_id": self.session_id, "turn_id": turn_id, "transport": self.transport}

    async def send_error(self, code: str, message: str, turn_id: TurnId | None = None) -> None:
        if self.metrics is not None:
            self.metrics.errors.labels(code).inc()
        log.info(
            "session %s turn %r: error %s: %s",
            self.session_id,
            turn_id,
            code,
            message,
            extra=self._ids(turn_id),
        )
        await self.sink.send_json(error_message(code, message, turn_id))

    # --- input -------------------------------------------------------------------------------------
    async def receive(self, raw: str | bytes) -> None:
        """One client message. Bad input is answered with an error message; nothing is raised."""
        self.t_last_input = time.monotonic()
        try:
            msg = parse_client_message(raw)
            if isinstance(msg, TextDelta) and not self._text_bucket.take(len(msg.text)):
                raise ProtocolError(
                    "rate_limited",
                    f"text is limited to {self.limits.text_chars_per_s:g} characters/s",
                    msg.turn_id,
                )
            self._dispatch(msg)
        except ProtocolError as err:
            await self.send_error(err.code, err.message, err.turn_id)
            return
        if isinstance(msg, SessionUpdate):
            await self.sink.send_json({"type": "session.updated", "audio": self.audio.describe()})

    def _dispatch(self, msg: object) -> None:
        if isinstance(msg, SessionUpdate):
            self._update(msg)
        elif isinstance(msg, TextDelta):
            turn = self._turn_for_text(msg.turn_id)
            turn.stream.push_text(msg.text)
        elif isinstance(msg, TextFlush):
            self._open_turn(msg.turn_id).stream.flush()
        elif isinstance(msg, TextEnd):
            turn = self._open_turn(msg.turn_id)
            turn.ended = True
            turn.stream.end()
        elif isinstance(msg, TurnCancel):
            self._cancel(msg.turn_id)

    def _update(self, msg: SessionUpdate) -> None:
        if msg.voice is not None and msg.voice and msg.voice not in self.engine.model.info.voices:
            raise ProtocolError("invalid_voice", f"unknown voice {msg.voice!r}")
        if msg.format is not None:
            self.audio.format = msg.format
        if msg.sample_rate is not None:
            self.audio.sample_rate = msg.sample_rate
        if msg.voice is not None:
            self.audio.voice = msg.voice

    def _turn_for_text(self, turn_id: TurnId) -> Turn:
        turn = self._turns.get(turn_id)
        if turn is not None:
            if turn.finished_input:
                raise ProtocolError("turn_ended", "this turn has ended; start a new turn_id", turn_id)
            return turn
        if turn_id in self._finished_set:
            raise ProtocolError("turn_ended", "this turn has ended; start a new turn_id", turn_id)
        if len(self._order) > self.limits.max_queued_turns:
            raise ProtocolError(
                "too_many_turns", f"at most {self.limits.max_queued_turns} turns may wait", turn_id
            )
        try:
            stream = self.engine.open_stream(voice=self.audio.voice)
        except EngineBusy as err:
            raise ProtocolError("server_busy", str(err), turn_id) from None
        except ValueError as err:
            raise ProtocolError("invalid_field", str(err), turn_id) from None
        turn = Turn(
            turn_id, stream, AudioSettings(self.audio.format, self.audio.sample_rate, self.audio.voice)
        )
        self._turns[turn_id] = turn
        self._order.append(turn)
        self._wake.set()
        return turn

    def _open_turn(self, turn_id: TurnId) -> Turn:
        turn = self._turns.get(turn_id)
        if turn is None:
            if turn_id in self._finished_set:
                raise ProtocolError("turn_ended", "this turn has ended", turn_id)
            raise ProtocolError("unknown_turn", "no text was sent for this turn_id", turn_id)
        if turn.finished_input:
            raise ProtocolError("turn_ended", "this turn has ended", turn_id)
        return turn

    def _cancel(self, turn_id: TurnId) -> None:
        turn = self._turns.get(turn_id)
        if turn is None:
            if turn_id in self._finished_set:
                return  # a cancel racing the turn's natural end: nothing left to stop
            raise ProtocolError("unknown_turn", "no text was sent for this turn_id", turn_id)
        turn.cancelled = True
        turn.stream.cancel()

    # --- output ------------------------------------------------------------------------------------
    async def _run_pump(self) -> None:
        while True:
            while not self._order:
                self._wake.clear()
                await self._wake.wait()
            turn = self._order[0]
            try:
                await self._play(turn)
            except asyncio.CancelledError:
                raise
            except SinkStalled:
                log.warning(
                    "session %s: the client stopped reading; cancelling its turns",
                    self.session_id,
                    extra=self._ids(),
                )
                self.slow_consumer = True
                for t in self._turns.values():
                    t.cancelled = True
                    t.stream.cancel()
                self._order.clear()
                self._turns.clear()
                return
            except Exception:
                log.exception(
                    "session %s: turn %r failed in the transport",
                    self.session_id,
                    turn.turn_id,
                    extra=self._ids(turn.turn_id),
                )
                turn.stream.cancel()
            finally:
                if self._order and self._order[0] is turn:
                    self._order.popleft()
                self._forget(turn)

    async def _play(self, turn: Turn) -> None:
        error: StreamError | None = None
        threshold_dbfs = self.engine.config.level.onset_threshold_dbfs
        if not turn.cancelled:
            await self.sink.start_turn(turn)
            await self.sink.send_json({"type": "turn.started", "turn_id": turn.turn_id})
            try:
                async for chunk in turn.stream:
                    if turn.cancelled:
                        break
                    if chunk.pcm.size:
                        now = time.perf_counter()
                        if turn.t_first_audio_sent is None:
                            turn.t_first_audio_sent = now
                        elif now - turn.t_first_audio_sent > turn.samples_sent / chunk.sample_rate_hz:
                            # A listener who started playing at the first audio would have run dry.
                            turn.underruns += 1
                        if turn.first_audible_sample is None:
                            onset = first_audible_sample(chunk.pcm, chunk.sample_rate_hz, threshold_dbfs)
                            if onset is not None:
                                turn.first_audible_sample = turn.samples_sent + onset
                        if chunk.text:
                            turn.text_sent.append(chunk.text)
                            turn.text_spans.append(
                                TextSpan.of_chunk(
                                    chunk.text,
                                    chunk.pcm,
                                    turn.samples_sent,
                                    chunk.sample_rate_hz,
                                    threshold_dbfs,
                                )
                            )
                        turn.samples_sent += chunk.pcm.size
                    await self.sink.send_audio(turn, chunk)
            except StreamError as err:
                error = err
        cancelled = turn.cancelled or turn.stream.cancelled
        played_ms = await self.sink.end_turn(turn, cancelled) if not cancelled or turn.samples_sent else 0.0
        # A sink that waits for playout (WebRTC) can see a barge-in land while it drains.
        cancelled = cancelled or turn.cancelled
        if error is not None:
            await self.send_error(error.code, str(error), turn.turn_id)
        reason = "cancelled" if cancelled else ("error" if error else "completed")
        self.turns_completed += 1
        done = self._done_message(turn, reason, played_ms)
        if self.metrics is not None:
            self.metrics.turns.labels(self.transport, reason).inc()
            if "ttfp_ms" in done["metrics"]:
                self.metrics.ttfp.labels(self.transport).observe(done["metrics"]["ttfp_ms"] / 1000)
            if turn.underruns:
                self.metrics.underruns.labels(self.transport).inc(turn.underruns)
        log.info(
            "session %s turn %r: %s, %.0f ms of audio",
            self.session_id,
            turn.turn_id,
            reason,
            done["audio_ms"],
            extra=self._ids(turn.turn_id),
        )
        await self.sink.send_json(done)

    def _done_message(self, turn: Turn, reason: str, played_ms: float) -> dict[str, Any]:
        m = turn.stream.metrics
        rate = self.engine.model.info.sample_rate_hz
        # A cut turn reports the words its played audio spoke (an estimate inside the last chunk:
        # realtime/truncation.py), so the agent can truncate its context to what was heard.
        text = (
            " ".join(turn.text_sent)
            if reason == "completed"
            else spoken_text(turn.text_spans, round(played_ms * rate / 1000))
        )
        metrics: dict[str, Any] = {
            "trimmed_ms": round(m.trimmed_samples * 1000 / rate, 1),
            "underruns": turn.underruns,
        }
        if turn.t_first_audio_sent is not None:
            metrics["ttfp_ms"] = round((turn.t_first_audio_sent - turn.t_first_text) * 1000, 2)
            if turn.first_audible_sample is not None:
                # Audible TTFA at the gateway: the first audible sample's place in the audio, for a
                # listener who plays from the first packet (the engine keeps 10 ms before it).
                ttfa_s = turn.t_first_audio_sent - turn.t_first_text + turn.first_audible_sample / rate
                metrics["ttfa_ms"] = round(ttfa_s * 1000, 2)
        if m.ttfp_s is not None:
            metrics["engine_ttfp_ms"] = round(m.ttfp_s * 1000, 2)
        return {
            "type": "turn.done",
            "turn_id": turn.turn_id,
            "reason": reason,
            "audio_ms": round(turn.samples_sent * 1000 / rate, 1),
            "played_ms": round(played_ms, 1),
            "text_spoken": text,
            "metrics": metrics,
        }

    def _forget(self, turn: Turn) -> None:
        self._turns.pop(turn.turn_id, None)
        turn.stream.cancel()  # no-op when finished; frees the engine slot otherwise
        self._finished.append(turn.turn_id)
        self._finished_set.add(turn.turn_id)
        if len(self._finished) > MAX_REMEMBERED_TURNS:
            self._finished_set.discard(self._finished.popleft())
