"""The transport-agnostic session core: protocol v1 messages in, turns spoken in order.

A ``Session`` owns a client's turns. Text deltas open an engine stream per turn at once (so a
later turn's audio is generated while an earlier one plays), but audio leaves strictly in turn
order through one pump task. Transports (WebSocket, WebRTC data channel + audio track) are thin
``SessionSink`` adapters: they send JSON, turn PCM into their wire format, and report how much of
a turn the client has been given.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import deque
from typing import Any

from voicewire.engine import (
    Engine,
    EngineBusy,
    EngineNotReady,
    Playout,
    StreamError,
    StreamParams,
    first_audible_sample,
)

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
from .truncation import SpokenRecord, SpokenWord, TextSpan
from .turn import AudioSettings, SessionSink, SinkStalled, Turn
from .voice_names import UnknownVoice, resolve_voice
from .voices import VoiceStore

log = logging.getLogger("voicewire.session")
_log_limiter = LogLimiter()  # process-wide: client errors are logged at a bounded rate per code

MAX_REMEMBERED_TURNS = 256  # finished turn ids kept to reject late text for them
# Finished turns whose words are kept for a late ``turn.cancel`` with ``played_ms``: the listener
# still hears the last one or two while the LLM's next replies queue behind them.
MAX_TRUNCATABLE_TURNS = 4


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
        self._finished: deque[TurnId] = deque()
        self._finished_set: set[TurnId] = set()
        self._spoken: dict[TurnId, SpokenRecord] = {}  # the last finished turns, oldest first
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
            if msg.played_ms is not None and msg.turn_id in self._spoken:
                return self._truncated(msg.turn_id, msg.played_ms)
            cut = self._turns.get(msg.turn_id)
            if cut is not None and msg.played_ms is not None:
                cut.played_report_ms = msg.played_ms
            self._cancel(msg.turn_id)
        return None

    def _cloned(self, voice: str) -> StreamParams | None:
        """A stored cloned voice's stream options, or None when ``voice`` names none."""
        if not voice or self.voices is None or voice in self.engine.info.voices:
            return None
        return self.voices.stream_params(voice, self.engine.info)

    def _voice(self, voice: str | None, turn_id: TurnId | None = None) -> str | None:
        """A client's voice name as the engine knows it: the rule /v1/audio/speech follows
        (voice_names.py: "alloy" is the default voice), a cloned voice's name kept for _cloned."""
        if voice and self._cloned(voice) is None:
            try:
                return resolve_voice(voice, self.engine.info.voices)
            except UnknownVoice as err:
                raise ProtocolError("invalid_voice", err.message, turn_id) from None
        return voice

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
        if turn_id in self._finished_set:
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
                params = self._cloned(voice) or StreamParams(voice=voice)
                extra = dict(params.extra)
                if options.instructions:
                    extra["instruct"] = options.instructions  # Qwen3-TTS 1.7B; other models ignore it
                params = dataclasses.replace(
                    params,
                    speed=options.speed if options.speed is not None else params.speed,
                    language=options.language if options.language is not None else params.language,
                    extra=extra,
                    tenant=self.share.tenant if self.share is not None else params.tenant,
                )
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
                        now = time.perf_counter()
                        if turn.t_first_audio_sent is None:
                            turn.t_first_audio_sent = now
                        listener.arrive(now, chunk.pcm.size / chunk.sample_rate_hz)
                        turn.underruns = listener.underruns
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
                        turn.t_last_activity = time.monotonic()
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
        done = self._done_message(turn, reason, played_ms, source)
        # From here a cancel's position can no longer go into this turn.done: it is answered with
        # turn.truncated (even while the turn.done is on its way).
        self._remember(turn)
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

    def _done_message(self, turn: Turn, reason: str, played_ms: float, played_source: str) -> dict[str, Any]:
        m = turn.stream.metrics
        rate = self.engine.info.sample_rate_hz
        # A cut turn reports the words its played audio spoke (from the word timings, or an estimate
        # inside the last chunk without them: realtime/truncation.py), so the agent can truncate its
        # context to what was heard.
        if reason in ("completed", "length"):
            text = " ".join(turn.text_sent)
        else:
            text = self._record(turn).text_spoken(round(played_ms * rate / 1000))
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
            "played_source": played_source,
            "text_spoken": text,
            "metrics": metrics,
        }

    @staticmethod
    def _record(turn: Turn) -> SpokenRecord:
        return SpokenRecord(turn.text_in.text, tuple(turn.words), tuple(turn.text_spans), turn.samples_sent)

    def _truncated(self, turn_id: TurnId, played_ms: float) -> dict[str, Any]:
        """``turn.truncated``: a finished turn's account at the position the client played it to
        (its ``turn.done`` told what was sent, which over the WebSocket is all of a reply long
        before it has played)."""
        record = self._spoken[turn_id]
        rate = self.engine.info.sample_rate_hz
        audio_ms = record.samples * 1000 / rate
        played_ms = min(played_ms, audio_ms)  # never more than the client got
        return {
            "type": "turn.truncated",
            "turn_id": turn_id,
            "audio_ms": round(audio_ms, 1),
            "played_ms": round(played_ms, 1),
            "played_source": "client",
            "text_spoken": record.text_spoken(round(played_ms * rate / 1000)),
        }

    def _remember(self, turn: Turn) -> None:
        self._spoken[turn.turn_id] = self._record(turn)
        if len(self._spoken) > MAX_TRUNCATABLE_TURNS:
            del self._spoken[next(iter(self._spoken))]

    def _forget(self, turn: Turn) -> None:
        self._turns.pop(turn.turn_id, None)
        turn.stream.cancel()  # no-op when finished; frees the engine slot otherwise
        self._finished.append(turn.turn_id)
        self._finished_set.add(turn.turn_id)
        if len(self._finished) > MAX_REMEMBERED_TURNS:
            self._finished_set.discard(self._finished.popleft())
