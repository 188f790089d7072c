"""Protocol v1 without a transport: turns, the messages that drive them, the audio they receive.

Turns of one connection are spoken in order: a turn started while another plays is generated at
once and heard after it. Audio messages carry no turn id; they belong to the turn between its
``turn.started`` and ``turn.done``. ``turn.words`` messages give the words of the audio that follows
them (``WordTiming``): read them with ``Turn.events()`` or ``Turn.words()``. ``ProtocolClient`` is this part; the WebSocket client
(``websocket.VoicewireClient``) and the aiortc peer (``webrtc.WebRtcClient``) add a transport and
so offer the same turns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from typing import Any

from .messages import (
    DEFAULT_SAMPLE_RATE_HZ,
    ReceivedAudio,
    TurnAudio,
    TurnDone,
    TurnEvent,
    TurnId,
    TurnWords,
    VoicewireError,
    WordTiming,
    delta_text,
)

log = logging.getLogger("voicewire.client")

# Errors answered to a turn's first text.delta: the server never opened the turn, so no
# turn.done will follow and the turn fails here.
TURN_REFUSED_CODES = frozenset(
    {
        "server_busy",
        "share_exceeded",
        "not_ready",
        "too_many_turns",
        "invalid_field",
        "invalid_voice",
        "rate_limited",
        "text_overflow",
    }
)

_END = object()


class Turn:
    """One agent utterance. Created by ``start_turn`` or ``speak``; text in, audio out."""

    def __init__(self, client: ProtocolClient, turn_id: TurnId) -> None:
        self.turn_id = turn_id
        self._client = client
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._done: asyncio.Future[TurnDone] = asyncio.get_running_loop().create_future()
        self._reading = False
        self._words: list[WordTiming] = []
        # Audio handed to the caller through audio() / events(): what a caller who plays what it
        # reads has played, reported with turn.cancel (see cancel()).
        self._consumed_s = 0.0
        self._sent_text = False
        self._closed_input = False  # end() or cancel() sent
        self._feeder: asyncio.Task[None] | None = None
        # The answer to a turn.cancel with played_ms: the turn.truncated message, or None when the
        # turn.done itself took the position (the cancel reached the server before the end).
        self._truncation: asyncio.Future[dict[str, Any] | None] | None = None
        self.started = False  # turn.started seen
        self.t_first_text_s: float | None = None  # perf_counter when the first delta was sent
        self.t_last_text_s: float | None = None  # perf_counter when the last delta was sent
        self.t_first_audio_s: float | None = None  # perf_counter when its first audio arrived
        self.t_done_s: float | None = None  # perf_counter when its turn.done arrived
        self.errors: list[VoicewireError] = []  # errors the server reported for this turn
        self.options: dict[str, Any] = {}  # voice, speed, language, instructions for this turn alone

    # --- text in ----------------------------------------------------------------------------------
    async def send(self, delta: str) -> None:
        """More text for this turn (an LLM delta). The first non-empty one starts the turn."""
        if self._closed_input or self._done.done():
            raise VoicewireError("turn_ended", "this turn has ended, failed or was cancelled", self.turn_id)
        if not delta:
            return
        msg: dict[str, Any] = {"type": "text.delta", "turn_id": self.turn_id, "text": delta}
        if not self._sent_text:
            msg.update(self.options)  # the turn's own voice, speed, ...: read from its first delta
        self._sent_text = True
        await self._client._send(msg)
        self.t_last_text_s = time.perf_counter()
        if self.t_first_text_s is None:
            self.t_first_text_s = self.t_last_text_s

    async def flush(self) -> None:
        """Speak what is buffered now, even mid-clause."""
        if self._sent_text and not self._closed_input:
            await self._client._send({"type": "text.flush", "turn_id": self.turn_id})

    async def end(self) -> None:
        """No more text. A turn that never had text ends here, with no audio."""
        if self._closed_input or self._done.done():  # done already: refused or failed, nothing to end
            return
        self._closed_input = True
        if self._sent_text:
            await self._client._send({"type": "text.end", "turn_id": self.turn_id})
        else:
            self._finish(TurnDone(self.turn_id, "completed", 0.0, 0.0, ""))

    async def cancel(self, timeout_s: float = 10.0, played_ms: float | None = None) -> TurnDone:
        """Barge-in: stop the turn now; returns what played of it (``played()``: ``played_ms``,
        ``text_spoken``). ``played_ms``: see ``send_cancel``; it counts after ``turn.done`` too."""
        await self.send_cancel(played_ms)
        return await self.played(timeout_s)

    async def played(self, timeout_s: float = 10.0) -> TurnDone:
        """The turn's ``turn.done``, cut at the position of the last ``send_cancel(played_ms=...)``:
        a reply the server finished sending before the listener barged in stays ``completed``, with
        the ``played_ms`` and ``text_spoken`` of its ``turn.truncated``."""
        done = await self.done(timeout_s)
        if self._truncation is None:
            return done
        truncated = await asyncio.wait_for(asyncio.shield(self._truncation), timeout_s)
        return done if truncated is None else done.truncated(truncated)

    async def send_cancel(self, played_ms: float | None = None) -> None:
        """Barge-in without waiting for ``turn.done`` (which still comes, see ``done()``): for
        interruption handlers that must not wait a round trip.

        ``played_ms``: how much of the turn's audio the listener heard, for the server to cut
        ``text_spoken`` there. By default, over a transport where the server cannot know it (the
        WebSocket), the audio this turn's reader has taken from ``audio()`` / ``events()`` (a
        caller that buffers before playing should pass its own position); nothing when nobody
        read the audio (the server then reports what it sent). Given after ``turn.done``, it is
        sent all the same: the server answers with ``turn.truncated`` (see ``played()``)."""
        if self._feeder is not None and self._feeder is not asyncio.current_task():
            self._feeder.cancel()
        if self._done.done():
            if played_ms is not None and self.result is not None and self._sent_text:
                await self._send_cancel(played_ms)
            return
        self._closed_input = True
        if self._sent_text:
            if played_ms is None and self._reading and self._client.reports_playback:
                played_ms = self.consumed_ms
            await self._send_cancel(played_ms)
        else:
            self._finish(TurnDone(self.turn_id, "cancelled", 0.0, 0.0, ""))

    async def _send_cancel(self, played_ms: float | None) -> None:
        msg: dict[str, Any] = {"type": "turn.cancel", "turn_id": self.turn_id}
        if played_ms is not None:
            msg["played_ms"] = round(max(0.0, played_ms), 1)
            if self._truncation is None or self._truncation.done():
                self._truncation = asyncio.get_running_loop().create_future()
            self._client._truncating[self.turn_id] = self
        await self._client._send(msg)

    def _truncated(self, msg: dict[str, Any] | None) -> None:
        if self._truncation is not None and not self._truncation.done():
            self._truncation.set_result(msg)

    @property
    def consumed_ms(self) -> float:
        """Audio of this turn handed to the caller so far (``audio()`` / ``events()``), in ms."""
        return self._consumed_s * 1000

    def words(self) -> list[WordTiming]:
        """The turn's words received so far (``turn.words``), in order; each arrives before its audio."""
        return list(self._words)

    # --- audio out ----------------------------------------------------------------------------------
    async def audio(self) -> AsyncIterator[ReceivedAudio]:
        """The turn's audio as it arrives, until ``turn.done``. Raises VoicewireError if the turn
        failed. One reader per turn."""
        async for event in self.events():
            if isinstance(event, ReceivedAudio):
                yield event

    async def events(self) -> AsyncIterator[TurnEvent]:
        """The turn's audio and its ``TurnWords`` in the order they arrived (each word before the
        audio holding its first sample), until ``turn.done``. Raises like ``audio()``; instead of it."""
        if self._reading:
            raise RuntimeError("turn.audio() can be read once")
        self._reading = True
        while True:
            item = await self._queue.get()
            if item is _END:
                break
            if isinstance(item, ReceivedAudio):
                self._consumed_s += item.duration_s
            yield item
        done = await self._done  # raises when the turn failed
        if done.reason == "error":
            raise (
                self.errors[-1]
                if self.errors
                else VoicewireError("model_error", "the turn failed", self.turn_id)
            )

    def __aiter__(self) -> AsyncIterator[ReceivedAudio]:
        return self.audio()

    async def collect(self, timeout_s: float | None = None) -> TurnAudio:
        """Read the whole turn: all its audio, then its ``turn.done``. A turn that failed on the
        server comes back with ``done.reason == "error"`` (its errors in ``errors``); a turn the
        server refused, or a lost connection, raises VoicewireError. Instead of ``audio()``."""
        if self._reading:
            raise RuntimeError("turn.audio() can be read once")
        self._reading = True

        async def read() -> TurnAudio:
            chunks: list[ReceivedAudio] = []
            while (item := await self._queue.get()) is not _END:
                if isinstance(item, ReceivedAudio):
                    self._consumed_s += item.duration_s
                    chunks.append(item)
            return TurnAudio(tuple(chunks), await self._done, tuple(self._words))

        return await asyncio.wait_for(read(), timeout_s)

    async def done(self, timeout_s: float | None = None) -> TurnDone:
        """Wait for ``turn.done``."""
        return await asyncio.wait_for(asyncio.shield(self._done), timeout_s)

    @property
    def result(self) -> TurnDone | None:
        """``turn.done`` if it came, else None."""
        if self._done.done() and not self._done.cancelled() and self._done.exception() is None:
            return self._done.result()
        return None

    # --- fed by the client --------------------------------------------------------------------------
    def _push_audio(self, audio: ReceivedAudio) -> None:
        if self.t_first_audio_s is None:
            self.t_first_audio_s = audio.t_received_s
        self._queue.put_nowait(audio)

    def _push_words(self, words: TurnWords) -> None:
        self._words.extend(words.words)
        self._queue.put_nowait(words)

    def _finish(self, done: TurnDone) -> None:
        if not self._done.done():
            self._done.set_result(done)
            self._queue.put_nowait(_END)

    def _fail(self, err: BaseException) -> None:
        if not self._done.done():
            self._done.set_exception(err)
            self._done.exception()  # retrieved: no "never retrieved" warning if nobody waits
            self._queue.put_nowait(_END)


class ProtocolClient:
    """Turn bookkeeping and message routing, independent of the transport."""

    # The server cannot see this transport's playback (WebSocket): turn.cancel reports it.
    reports_playback = True

    def __init__(self) -> None:
        self.session: dict[str, Any] = {}  # session.created
        self.audio_format = "pcm16"
        self.sample_rate_hz = DEFAULT_SAMPLE_RATE_HZ
        self.errors: list[VoicewireError] = []  # errors that concern no turn
        self._turns: dict[TurnId, Turn] = {}
        self._truncating: dict[TurnId, Turn] = {}  # turns that sent a played_ms not yet answered
        self._playing: Turn | None = None
        self._next_turn = 0
        self._closed = False
        self._waiters: list[tuple[str, asyncio.Future[dict[str, Any]]]] = []

    async def _send(self, msg: dict[str, Any]) -> None:
        raise NotImplementedError

    async def send_message(self, msg: dict[str, Any]) -> None:
        """Send any protocol message as it is, outside the turn bookkeeping: for tests and tools
        that must send what a ``Turn`` would not (text for a turn that ended, a cancel race)."""
        await self._send(msg)

    async def close(self) -> None:
        raise NotImplementedError

    @property
    def closed(self) -> bool:
        """The connection is gone (closed by either side); open a new client to go on."""
        return self._closed

    # --- turns --------------------------------------------------------------------------------------
    async def start_turn(self, turn_id: TurnId | None = None, **options: Any) -> Turn:
        """A new turn; nothing is sent until its first ``send``. ``options``: this turn's own
        ``voice``, ``speed``, ``language``, ``instructions`` (the session's for what is not given)."""
        return self._new_turn(turn_id, options)

    def speak(
        self, deltas: AsyncIterable[Any] | Iterable[Any], turn_id: TurnId | None = None, **options: Any
    ) -> Turn:
        """Speak an LLM's stream in one call: each item's text (``delta_text``) is sent as it comes,
        then ``text.end``. Iterate the returned turn for its audio; ``await turn.cancel()`` to
        barge in (it also stops reading the stream). An exception from the stream cancels the turn
        and is raised from its ``audio()``. ``options`` as for ``start_turn``."""
        turn = self._new_turn(turn_id, options)
        turn._feeder = asyncio.create_task(self._feed(turn, deltas), name=f"voicewire-feed-{turn.turn_id}")
        return turn

    async def _feed(self, turn: Turn, deltas: AsyncIterable[Any] | Iterable[Any]) -> None:
        try:
            if isinstance(deltas, AsyncIterable):
                async for item in deltas:
                    await turn.send(delta_text(item))
            else:
                for item in deltas:
                    await turn.send(delta_text(item))
            await turn.end()
        except asyncio.CancelledError:
            raise
        except Exception as err:
            # The caller hears of it from the turn (its done() and audio raise it), not from a
            # log line; the server is told to stop, and its turn.done finds the turn over.
            log.debug("turn %r: the text stream failed (%s); cancelling the turn", turn.turn_id, err)
            turn._fail(err)
            with contextlib.suppress(Exception):
                await turn._send_cancel(None)

    def _new_turn(self, turn_id: TurnId | None, options: dict[str, Any] | None = None) -> Turn:
        if self._closed:
            raise VoicewireError("closed", "the connection is closed")
        if turn_id is None:
            self._next_turn += 1
            turn_id = self._next_turn
        if turn_id in self._turns:
            raise ValueError(f"turn {turn_id!r} is still open")
        turn = Turn(self, turn_id)
        turn.options = {k: v for k, v in (options or {}).items() if v is not None}
        self._turns[turn_id] = turn
        turn._done.add_done_callback(lambda _: self._turns.pop(turn.turn_id, None))
        return turn

    # --- incoming -----------------------------------------------------------------------------------
    def _on_audio(self, audio: ReceivedAudio) -> None:
        if self._playing is not None:
            self._playing._push_audio(audio)

    def _on_json(self, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        for waiter in [w for w in self._waiters if w[0] == kind]:
            self._waiters.remove(waiter)
            if not waiter[1].done():
                waiter[1].set_result(msg)
        turn = self._turns.get(msg["turn_id"]) if "turn_id" in msg else None
        if kind == "session.created":
            self.session = msg
            self._set_audio(msg.get("audio") or {})
        elif kind == "session.updated":
            self._set_audio(msg.get("audio") or {})
        elif kind == "turn.started" and turn is not None:
            turn.started = True
            self._playing = turn
        elif kind == "turn.words" and turn is not None:
            words = tuple(WordTiming.from_message(w) for w in msg.get("words") or ())
            turn._push_words(TurnWords(turn.turn_id, words))
        elif kind == "turn.done":
            if turn is not None:
                turn.t_done_s = time.perf_counter()
                turn._finish(TurnDone.from_message(msg))
                if msg.get("played_source") == "client" and self._truncating.pop(turn.turn_id, None):
                    turn._truncated(None)  # the cancel's position is in this turn.done
            if self._playing is turn:
                self._playing = None
        elif kind == "turn.truncated":
            truncating = self._truncating.pop(msg.get("turn_id", ""), None)
            if truncating is not None:
                truncating._truncated(msg)
        elif kind == "error":
            err = VoicewireError(str(msg.get("code")), str(msg.get("message")), msg.get("turn_id"))
            if turn is None:
                log.debug("voicewire error: %s", err)  # the caller reads it from client.errors
                self.errors.append(err)
                return
            turn.errors.append(err)
            if not turn.started and err.code in TURN_REFUSED_CODES:
                turn._fail(err)

    def _set_audio(self, audio: dict[str, Any]) -> None:
        self.audio_format = str(audio.get("format", self.audio_format))
        self.sample_rate_hz = int(audio.get("sample_rate", self.sample_rate_hz))

    def expect(self, kind: str) -> asyncio.Future[dict[str, Any]]:
        """The next message of type ``kind`` (e.g. ``"error"``), as a future: call it before
        sending what it answers."""
        return self._expect(kind)

    def _expect(self, kind: str) -> asyncio.Future[dict[str, Any]]:
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiters.append((kind, fut))
        return fut

    def _connection_lost(self, reason: str) -> None:
        self._closed = True
        err = VoicewireError("connection_closed", reason)
        for turn in list(self._turns.values()):
            turn._fail(err)
        for turn in self._truncating.values():
            if turn._truncation is not None and not turn._truncation.done():
                turn._truncation.set_exception(err)
                turn._truncation.exception()  # retrieved: nobody may wait for it
        self._truncating.clear()
        for _, fut in self._waiters:
            if not fut.done():
                fut.set_exception(err)
        self._waiters.clear()

    async def _configure(self, format: str, sample_rate_hz: int, voice: str | None, timeout_s: float) -> None:
        update: dict[str, Any] = {}
        if format != self.audio_format:
            update["format"] = format
        if sample_rate_hz != self.sample_rate_hz:
            update["sample_rate"] = sample_rate_hz
        if voice:
            update["voice"] = voice
        if update:
            reply = self._expect("session.updated")
            await self._send({"type": "session.update", **update})
            refused = self._expect("error")
            finished, _ = await asyncio.wait(
                {reply, refused}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
            for fut in (reply, refused):
                if fut not in finished:
                    fut.cancel()
            if refused in finished:
                msg = refused.result()
                raise VoicewireError(str(msg.get("code")), str(msg.get("message")))
            if not finished:
                raise TimeoutError("no session.updated")
