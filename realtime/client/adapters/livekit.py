"""voicewire as a LiveKit Agents TTS (``pip install voicewire[livekit]``).

    from voicewire.realtime.client.adapters.livekit import VoicewireTTS
    session = AgentSession(stt=..., llm=..., tts=VoicewireTTS(url="http://127.0.0.1:8080"),
                           use_tts_aligned_transcript=True)
    await session.start(agent=Agent(instructions="..."), room=ctx.room)

``stream()`` gives a ``SynthesizeStream``: one stream is one voicewire turn. ``push_text`` sends a
``text.delta`` as it comes (no sentence tokenizer in between: voicewire's clause feeder starts
speaking after a short first fragment), ``flush`` sends ``text.flush`` (speak what is buffered
now), ``end_input`` sends ``text.end``; the stream yields PCM frames at the TTS's ``sample_rate``
(any rate: 24 and 48 kHz come from the server as they are, others are resampled here) and ends
after the turn's ``turn.done``.

Aligned transcripts: the server's ``turn.words`` become ``TimedString``s (the text sent, cut at
each word, with its start and end in the turn's audio) on the frames they precede, so an agent
with ``use_tts_aligned_transcript`` shows each word as it plays and, when the user barges in,
keeps in its chat context only what was heard. Interruption: LiveKit closes the stream
(``aclose``), which sends ``turn.cancel`` with the position played by then (each frame taken to
play in order, in real time, from when the agent took it); the server drops the turn's queued
audio and frees its engine slot; a turn the server had already sent in full, closed before the
reader took all of it, is truncated there instead (``turn.truncated``: ``stream.turn.played()``).
``synthesize`` (one text, non-streaming) runs through the same stream.

Errors are LiveKit's: ``APIConnectionError`` (cannot connect, connection lost), ``APITimeoutError``
(the handshake timed out), ``APIStatusError`` for what the server refused, with the HTTP status
its code stands for (503 ``server_busy``: retryable; 400 ``invalid_voice``: not).

All streams of one ``VoicewireTTS`` share one WebSocket session (opened on first use or by
``prewarm``); the server speaks its turns in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from livekit import rtc
from livekit.agents import APIConnectionError, APIError, APIStatusError, APITimeoutError, tts, utils
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS, APIConnectOptions, TimedString

from .. import Turn, TurnWords, VoicewireClient, VoicewireError

SERVER_RATES_HZ = (24_000, 48_000)  # what session.update offers; other rates are resampled here
# The HTTP status each protocol v1 error code stands for (the gateway answers the same codes over
# HTTP with these); LiveKit decides from it whether to retry (4xx but 408/429: never).
STATUS_OF_CODE = {
    "missing_credentials": 401,
    "invalid_api_key": 401,
    "invalid_token": 401,
    "expired_token": 401,
    "token_reused": 401,
    "origin_not_allowed": 403,
    "invalid_voice": 400,
    "invalid_field": 400,
    "missing_field": 400,
    "text_too_long": 400,
    "too_many_turns": 429,
    "rate_limited": 429,
    "text_overflow": 429,
    "server_busy": 503,
    "not_ready": 503,
    "too_many_sessions": 503,
    "draining": 503,
}


def api_error(err: VoicewireError) -> APIError:
    """A voicewire error as the LiveKit error a plugin raises for it."""
    message = f"voicewire: {err}"
    if err.code in ("connection_closed", "closed"):
        return APIConnectionError(message)
    status = STATUS_OF_CODE.get(err.code)
    if status is None and err.code.startswith("http_") and err.code[5:].isdigit():
        status = int(err.code[5:])  # a refusal without a JSON body
    return APIStatusError(message, status_code=status or 500, body={"code": err.code, "message": err.message})


class VoicewireTTS(tts.TTS):
    def __init__(
        self,
        *,
        url: str = "http://127.0.0.1:8080",
        voice: str | None = None,
        api_key: str | None = None,
        sample_rate: int = SERVER_RATES_HZ[0],
    ) -> None:
        if not isinstance(sample_rate, int) or sample_rate <= 0:
            raise ValueError(
                f"VoicewireTTS: sample_rate must be a positive number of Hz, not {sample_rate!r}"
            )
        super().__init__(
            capabilities=tts.TTSCapabilities(streaming=True, aligned_transcript=True),
            sample_rate=sample_rate,
            num_channels=1,
        )
        self._url = url
        self._voice = voice
        self._api_key = api_key
        self._server_rate_hz = sample_rate if sample_rate in SERVER_RATES_HZ else SERVER_RATES_HZ[0]
        self._client: VoicewireClient | None = None
        self._connecting = asyncio.Lock()
        self._streams: set[VoicewireSynthesizeStream] = set()
        self._prewarm: asyncio.Future[VoicewireClient] | None = None

    @property
    def model(self) -> str:
        return "voicewire"

    @property
    def provider(self) -> str:
        return "voicewire"

    async def client(self, timeout_s: float = DEFAULT_API_CONNECT_OPTIONS.timeout) -> VoicewireClient:
        """The shared session, (re)connected on demand within ``timeout_s`` (the stream's
        ``APIConnectOptions.timeout``)."""
        async with self._connecting:
            if self._client is None or self._client.closed:
                try:
                    self._client = await VoicewireClient.connect(
                        self._url,
                        sample_rate_hz=self._server_rate_hz,
                        voice=self._voice,
                        api_key=self._api_key,
                        timeout_s=timeout_s,
                    )
                except VoicewireError as err:  # refused at the handshake, or session.update refused
                    raise api_error(err) from err
                except TimeoutError as err:
                    raise APITimeoutError(f"voicewire: no session from {self._url} in time") from err
                except OSError as err:
                    raise APIConnectionError(f"voicewire: cannot connect to {self._url}: {err}") from err
            return self._client

    def prewarm(self) -> None:
        """Open the session now, so the first turn does not pay for the WebSocket handshake."""
        self._prewarm = asyncio.ensure_future(self.client())
        # A failed prewarm is seen again by the first stream; not retrieving it here would log it.
        self._prewarm.add_done_callback(lambda fut: fut.cancelled() or fut.exception())

    def stream(
        self, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
    ) -> VoicewireSynthesizeStream:
        stream = VoicewireSynthesizeStream(tts=self, conn_options=conn_options)
        self._streams.add(stream)
        return stream

    def synthesize(
        self, text: str, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
    ) -> tts.ChunkedStream:
        return self._synthesize_with_stream(text, conn_options=conn_options)

    async def aclose(self) -> None:
        for stream in list(self._streams):
            await stream.aclose()
        self._streams.clear()
        if self._client is not None:
            await self._client.close()
            self._client = None


class VoicewireSynthesizeStream(tts.SynthesizeStream):
    """One voicewire turn: text in as it is pushed, audio and its timed words out as they come."""

    def __init__(self, *, tts: VoicewireTTS, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, conn_options=conn_options)
        self._vw_tts = tts
        self.turn: Turn | None = None  # the voicewire turn of the current attempt
        # The audio handed to the reader (the agent's audio output), and when it has played out
        # for a reader that plays each frame as it takes it, in real time (time.monotonic()).
        self._handed_s = 0.0
        self._playout_end_s = 0.0
        self._read_all = False  # the reader took the stream to its end
        self._reported = False  # a turn.cancel told the server the position played

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        rate_hz = self._vw_tts.sample_rate
        output_emitter.initialize(
            request_id=utils.shortuuid(),
            sample_rate=rate_hz,
            num_channels=1,
            mime_type="audio/pcm",
            stream=True,
        )
        client = await self._vw_tts.client(self._conn_options.timeout)
        try:
            turn = self.turn = await client.start_turn()
        except VoicewireError as err:
            raise api_error(err) from err
        text = ""  # what was sent, joined: the word timings' char offsets index it
        segment_open = False
        self._handed_s, self._playout_end_s, self._reported = 0.0, 0.0, False

        async def send_text() -> None:
            nonlocal segment_open, text
            async for data in self._input_ch:
                if isinstance(data, self._FlushSentinel):
                    await turn.flush()
                    continue
                if not segment_open:
                    output_emitter.start_segment(segment_id=str(turn.turn_id))
                    segment_open = True
                self._mark_started()
                text += data
                await turn.send(data)
            await turn.end()

        async def receive() -> None:
            resampler = (
                rtc.AudioResampler(client.sample_rate_hz, rate_hz)
                if client.sample_rate_hz != rate_hz
                else None
            )
            spoken_to = 0  # end of the text given to timed strings so far
            async for event in turn.events():
                if isinstance(event, TurnWords):
                    timed = []
                    for w in event.words:
                        # The text from the previous word's end to this one's: the strings
                        # joined are the text sent, and each carries its word's times.
                        timed.append(
                            TimedString(text[spoken_to : w.char_end], w.start_ms / 1000, w.end_ms / 1000)
                        )
                        spoken_to = max(spoken_to, w.char_end)
                    output_emitter.push_timed_transcript(timed)
                    continue
                if resampler is None:
                    output_emitter.push(event.data)
                    continue
                for frame in resampler.push(bytearray(event.data)):
                    output_emitter.push(frame.data.tobytes())
            if resampler is not None:
                for frame in resampler.flush():
                    output_emitter.push(frame.data.tobytes())
            await turn.done()
            if segment_open:
                output_emitter.end_segment()

        tasks = [asyncio.create_task(send_text()), asyncio.create_task(receive())]
        try:
            await asyncio.gather(*tasks)
        except VoicewireError as err:
            raise api_error(err) from err
        finally:
            await utils.aio.cancel_and_wait(*tasks)
            if turn.result is None and not client.closed:
                # Closed early (an interruption, or an error): barge in at what the reader has
                # played. Not waiting for turn.done keeps aclose() as quick as LiveKit expects.
                await self._report_played(turn)

    async def _report_played(self, turn: Turn) -> None:
        """``turn.cancel`` at the position played, for a reader that plays each frame as it takes it."""
        self._reported = True
        played_s = self._handed_s - max(0.0, self._playout_end_s - time.monotonic())
        with contextlib.suppress(VoicewireError):
            await turn.send_cancel(played_ms=played_s * 1000)

    async def __anext__(self) -> tts.SynthesizedAudio:
        try:
            ev = await super().__anext__()
        except StopAsyncIteration:
            self._read_all = True
            raise
        self._handed_s += ev.frame.duration
        self._playout_end_s = max(self._playout_end_s, time.monotonic()) + ev.frame.duration
        return ev

    async def aclose(self) -> None:
        await super().aclose()
        self._vw_tts._streams.discard(self)
        turn, client = self.turn, self._vw_tts._client
        # The server had sent all of the turn (its turn.done came) but the reader stopped before
        # its end: an interruption of audio still to play. The server truncates the finished turn
        # there (turn.truncated; ``turn.played()``). A reader that took it all closes as a
        # finished reply does, and nothing is reported.
        interrupted = turn is not None and turn.result is not None and not self._read_all and not self._reported
        if interrupted and turn is not None and client is not None and not client.closed:
            await self._report_played(turn)
