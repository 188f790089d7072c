"""The transport-agnostic session core: protocol v1 messages in, turns spoken in order.

A ``Session`` owns a client's turns. Text deltas open an engine stream per turn at once (so a
later turn's audio is generated while an earlier one plays), but audio leaves strictly in turn
order through one pump task. Transports (WebSocket, WebRTC data channel + audio track) are thin
``SessionSink`` adapters: they send JSON, turn PCM into their wire format, and report how much of
a turn the client has been given.

Below it: a turn's stream options (turn_params.py), its account of the audio sent and the
``turn.done`` / ``turn.truncated`` reports (turn_report.py), and what is kept of finished turns
(finished_turns.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any

from voicewire.engine import Engine, EngineBusy, EngineNotReady, Playout, StreamError

from .finished_turns import MAX_REMEMBERED_TURNS, FinishedTurns
from .limits import SessionLimits, TokenBucket
from .log_limit import LogLimiter
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
    TurnOptions,
    error_message,
    parse_client_message,
)
from .quotas import StreamShare
from .truncation import SpokenWord
from .turn import AudioSettings, SessionSink, SinkStalled, Turn
from .turn_params import engine_voice, turn_params
from .turn_report import done_message, note_chunk, spoken_record, truncated_message
from .voices import VoiceStore

log = logging.getLogger("voicewire.session")
_log_limiter = LogLimiter()  # process-wide: client errors are logged at a bounded rate per code


class Session:
    def __init__(
        self,
        engine: Engine,
        sink: SessionSink,
        session_id: str,
        limits: SessionLimits | None = None,
        metrics: GatewayMetrics | None = None,
        transport: str = "websocket",
        voices: VoiceStore | None = None,
        share: StreamShare | None = None,
    ) -> None:
        self.engine = engine
        self.share = share  # the client's stream share every turn opens through (quotas.py)
        self.voices = voices  # cloned voices a session.update may name (by id or name)
        self.sink = sink
        self.session_id = session_id
        self.limits = limits or SessionLimits()
        self.metrics = metrics
        self.transport = transport
        self.audio = AudioSettings()
        self.t_started = time.monotonic()
        self.t_last_input = self.t_started
        self._text_bucket = TokenBucket(self.limits.text_chars_per_s, self.limits.text_burst_chars)
        self._delta_bucket = TokenBucket(self.limits.deltas_per_s, self.limits.delta_burst)
        self._error_bucket = TokenBucket(self.limits.errors_per_s, self.limits.error_burst)
        self._turns: dict[TurnId, Turn] = {}
        self._order: deque[Turn] = deque()
        self._finished = FinishedTurns()
        # Turns refused at their first delta (busy, not ready, too many): the client was told once;
        # the rest of the LLM's deltas and the text.end for them are dropped without more errors.
        self._refused: deque[TurnId] = deque(maxlen=MAX_REMEMBERED_TURNS)
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
                "voices": list(self.engine.info.voices),
                "limits": {
                    "max_message_bytes": MAX_MESSAGE_BYTES,
                    "max_text_chars": MAX_TEXT_CHARS,
                    "max_open_turns": self.limits.max_open_turns,
                    "max_unspoken_chars": self.limits.max_unspoken_chars,
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
        """Why the transport should close this session now (lifetime, idle), or None. Also ends
        open turns that went idle (no text, no audio): a client that opens turns and stops
        sending must not hold engine streams until the session's lifetime runs out."""
        if now - self.t_started > self.limits.max_lifetime_s:
            return "session_expired"
        for turn in list(self._turns.values()):
            if not turn.finished_input and now - turn.t_last_activity > self.limits.idle_timeout_s:
                log.info("session %s turn %r: no text for %.0f s; ending it", self.session_id,
                         turn.turn_id, now - turn.t_last_activity, extra=self._ids(turn.turn_id))
                turn.timed_out = True
                self._cancel(turn.turn_id)
        if not self._turns and now - self.t_last_input > self.limits.idle_timeout_s:
            return "idle_timeout"
        return None

    def _ids(self, turn_id: TurnId | None = None) -> dict[str, Any]:
        """Structured log fields (``--log-format json`` prints them)."""
        return {"session_id": self.session_id, "turn_id": turn_id, "transport": self.transport}

    async def send_error(
        self, code: str, message: str, turn_id: TurnId | None = None, *, always: bool = False
    ) -> None:
        """An ``error`` message. Input errors are answered up to the session's error rate (a flood
        of bad messages costs neither bandwidth nor log lines; each is still counted); ``always``
        for errors that explain a turn's end."""
        if self.metrics is not None:
            self.metrics.errors.labels(code).inc()
        _log_limiter.log(
            log,
            "session %s turn %r: error %s: %s",
            self.session_id,
            turn_id,
            code,
            message[:200],
            key=code,
            extra=self._ids(turn_id),
        )
        if always or self._error_bucket.take(1):
            await self.sink.send_json(error_message(code, message, turn_id))

    # --- input -------------------------------------------------------------------------------------
    async def receive(self, raw: str | bytes) -> None:
        """One client message. Bad input is answered with an error message; nothing is raised."""
        self.t_last_input = time.monotonic()
        try:
            msg = parse_client_message(raw)
            if isinstance(msg, TextDelta) and not (
                self._delta_bucket.take(1) and self._text_bucket.take(len(msg.text))
            ):
                raise ProtocolError(
                    "rate_limited",
                    f"text is limited to {self.limits.text_chars_per_s:g} characters "
                    f"and {self.limits.deltas_per_s:g} deltas a second",
                    msg.turn_id,
                )
            answer = self._dispatch(msg)
        except ProtocolError as err:
            await self.send_error(err.code, err.message, err.turn_id)
            return
        except Exception as err:  # a bug must cost one message, never the session's receive loop
            _log_limiter.log(log, "session %s: message failed", self.session_id, key="internal_error",
                             level=logging.ERROR, exc_info=True, extra=self._ids())
            await self.send_error("internal_error", f"the server failed on this message: {type(err).__name__}")
            return
        if isinstance(msg, SessionUpdate):
            await self.sink.send_json({"type": "session.updated", "audio": self.audio.describe()})
        if answer is not None:
            await self.sink.send_json(answer)

    def _dispatch(self, msg: object) -> dict[str, Any] | None:
        """Apply one message; returns the message that answers it at once, if any."""
        if getattr(msg, "turn_id", None) in self._refused:
            return None
        if isinstance(msg, SessionUpdate):
            self._update(msg)
        elif isinstance(msg, TextDelta):
            turn = self._turn_for_text(msg.turn_id, msg.options)
            if self._unspoken_chars() + len(msg.text) > self.limits.max_unspoken_chars:
                raise ProtocolError(
                    "text_overflow",
                    f"at most {self.limits.max_unspoken_chars} characters may wait to be spoken",
                    msg.turn_id,
                )
            turn.chars_in += len(msg.text)
            turn.t_last_activity = time.monotonic()
            turn.text_in.push(msg.text)
            turn.stream.push_text(msg.text)
        elif isinstance(msg, TextFlush):
            self._open_turn(msg.turn_id).stream.flush()
        elif isinstance(msg, TextEnd):
            turn = self._open_turn(msg.turn_id)
            turn.ended = True
            turn.stream.end()
        elif isinstance(msg, TurnCancel):
            record = self._finished.spoken(msg.turn_id)
            if msg.played_ms is not None and record is not None:
                return truncated_message(msg.turn_id, record, msg.played_ms, self.engine.info.sample_rate_hz)
            cut = self._turns.get(msg.turn_id)
            if cut is not None and msg.played_ms is not None:
                cut.played_report_ms = msg.played_ms
            self._cancel(msg.turn_id)
        return None

    def _voice(self, voice: str | None, turn_id: TurnId | None = None) -> str | None:
        return engine_voice(voice, self.voices, self.engine.info, turn_id)  # turn_params.py

    def _update(self, msg: SessionUpdate) -> None:
        voice = self._voice(msg.voice)
        if msg.format is not None:
            self.audio.format = msg.format
        if msg.sample_rate is not None:
            self.audio.sample_rate = msg.sample_rate
        if voice is not None:
            self.audio.voice = voice

    def _turn_for_text(self, turn_id: TurnId, options: TurnOptions) -> Turn:
        turn = self._turns.get(turn_id)
        if turn is not None:
            if turn.finished_input:
                raise ProtocolError("turn_ended", "this turn has ended; start a new turn_id", turn_id)
            return turn
        if turn_id in self._finished:
            raise ProtocolError("turn_ended", "this turn has ended; start a new turn_id", turn_id)
        try:
            if len(self._turns) >= self.limits.max_open_turns:
                raise ProtocolError(
                    "too_many_turns", f"at most {self.limits.max_open_turns} turns may be open at once", turn_id
                )
            if self.share is not None and not self.share.admit():
                if self.metrics is not None:
                    self.metrics.quota_refusals.labels("streams").inc()
                raise ProtocolError(
                    "share_exceeded",
                    "this client holds its share of the engine's streams while others wait; "
                    "retry when one of its turns ends",
                    turn_id,
                )
            voice = self.audio.voice if options.voice is None else self._voice(options.voice, turn_id) or ""
            try:
                tenant = self.share.tenant if self.share is not None else None
                params = turn_params(voice, options, self.voices, self.engine.info, tenant)
                stream = self.engine.open_stream(params)
            except EngineBusy as err:
                raise ProtocolError("server_busy", str(err), turn_id) from None
            except EngineNotReady as err:
                raise ProtocolError("not_ready", str(err), turn_id) from None
            except ValueError as err:
                raise ProtocolError("invalid_field", str(err), turn_id) from None
        except ProtocolError:
            self._refused.append(turn_id)
            raise
        if self.share is not None:
            self.share.hold(stream)
        turn = Turn(
            turn_id, stream, AudioSettings(self.audio.format, self.audio.sample_rate, voice)
        )
        self._turns[turn_id] = turn
        self._order.append(turn)
        self._wake.set()
        return turn

    def _unspoken_chars(self) -> int:
        return sum(max(0, t.chars_in - len(t.stream.metrics.text_spoken)) for t in self._turns.values())

    def _open_turn(self, turn_id: TurnId) -> Turn:
        turn = self._turns.get(turn_id)
        if turn is None:
            if turn_id in self._finished:
                raise ProtocolError("turn_ended", "this turn has ended", turn_id)
            raise ProtocolError("unknown_turn", "no text was sent for this turn_id", turn_id)
        if turn.finished_input:
            raise ProtocolError("turn_ended", "this turn has ended", turn_id)
        return turn

    def _cancel(self, turn_id: TurnId) -> None:
        turn = self._turns.get(turn_id)
        if turn is None:
            if turn_id in self._finished:
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
        threshold_dbfs = self.engine.onset_threshold_dbfs
        listener = Playout()  # a listener who plays from the first audio, for the underrun count
        if not turn.cancelled:
            await self.sink.start_turn(turn)
            await self.sink.send_json({"type": "turn.started", "turn_id": turn.turn_id})
            try:
                async for chunk in turn.stream:
                    if turn.cancelled:
                        break
                    if chunk.pcm.size:
                        note_chunk(turn, chunk, listener, threshold_dbfs)  # turn_report.py
                    if chunk.words:
                        words = [
                            SpokenWord(w.word, w.start, w.end, *turn.text_in.locate(w.word)) for w in chunk.words
                        ]
                        turn.words += words
                        await self.sink.send_words(turn, words)
                    await self.sink.send_audio(turn, chunk)
            except StreamError as err:
                error = err
        cancelled = turn.cancelled or turn.stream.cancelled
        played_ms = await self.sink.end_turn(turn, cancelled) if not cancelled or turn.samples_sent else 0.0
        source = self.sink.played_source
        if turn.played_report_ms is not None:  # the client knows what it played, never more than it got
            sent_ms = turn.samples_sent * 1000 / self.engine.info.sample_rate_hz
            played_ms, source = min(turn.played_report_ms, sent_ms), "client"
        # A sink that waits for playout (WebRTC) can see a barge-in land while it drains.
        cancelled = cancelled or turn.cancelled
        if error is not None:
            await self.send_error(error.code, str(error), turn.turn_id, always=True)
        reason = (
            "timeout" if turn.timed_out else "cancelled" if cancelled else "error" if error else "completed"
        )
        if reason == "completed" and turn.stream.stop_reason == "length":
            reason = "length"  # a length cap or a runaway guard of the model ended it (all of it was sent)
        self.turns_completed += 1
        done = done_message(turn, reason, played_ms, source, self.engine.info.sample_rate_hz)
        # From here a cancel's position can no longer go into this turn.done: it is answered with
        # turn.truncated (even while the turn.done is on its way).
        self._finished.keep_spoken(turn.turn_id, spoken_record(turn))
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

    def _forget(self, turn: Turn) -> None:
        self._turns.pop(turn.turn_id, None)
        turn.stream.cancel()  # no-op when finished; frees the engine slot otherwise
        self._finished.add(turn.turn_id)
