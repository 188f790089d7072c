"""voicewire as a LiveKit Agents TTS (``pip install voicewire[livekit]``).

    from voicewire.realtime.client.adapters.livekit import VoicewireTTS
    session = AgentSession(stt=..., llm=..., tts=VoicewireTTS(url="http://127.0.0.1:8080"))
    await session.start(agent=Agent(instructions="..."), room=ctx.room)

``stream()`` gives a ``SynthesizeStream``: one stream is one voicewire turn. ``push_text`` sends a
``text.delta`` as it comes (no sentence tokenizer in between: voicewire's clause feeder starts
speaking after a short first fragment), ``flush`` sends ``text.flush`` (speak what is buffered
now), ``end_input`` sends ``text.end``; the stream yields 24 kHz PCM frames and ends after the
turn's ``turn.done``. Interruption: LiveKit closes the stream (``aclose``, e.g. when the user
barges in and the agent's ``tts_node`` is cancelled), which sends ``turn.cancel``; the server drops
the turn's queued audio and frees its engine slot. ``synthesize`` (one text, non-streaming) runs
through the same stream.

All streams of one ``VoicewireTTS`` share one WebSocket session (opened on first use or by
``prewarm``); the server speaks its turns in order.
"""

from __future__ import annotations

import asyncio
import contextlib

from livekit.agents import APIConnectionError, APIError, tts, utils
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS, APIConnectOptions

from .. import Turn, VoicewireClient, VoicewireError

SAMPLE_RATE_HZ = 24_000  # the engine's own rate (LiveKit's room output is 24 kHz too): no resampling
RETRYABLE_CODES = frozenset({"server_busy", "connection_closed"})


class VoicewireTTS(tts.TTS):
    def __init__(
        self,
        *,
        url: str = "http://127.0.0.1:8080",
        voice: str | None = None,
        api_key: str | None = None,
        sample_rate: int = SAMPLE_RATE_HZ,
    ) -> None:
        super().__init__(
            capabilities=tts.TTSCapabilities(streaming=True), sample_rate=sample_rate, num_channels=1
        )
        self._url = url
        self._voice = voice
        self._api_key = api_key
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

    async def client(self) -> VoicewireClient:
        """The shared session, (re)connected on demand."""
        async with self._connecting:
            if self._client is None or self._client.closed:
                try:
                    self._client = await VoicewireClient.connect(
                        self._url, sample_rate_hz=self.sample_rate, voice=self._voice, api_key=self._api_key
                    )
                except (OSError, TimeoutError) as err:
                    raise APIConnectionError(f"voicewire: cannot connect to {self._url}: {err}") from err
            return self._client

    def prewarm(self) -> None:
        """Open the session now, so the first turn does not pay for the WebSocket handshake."""
        self._prewarm = asyncio.ensure_future(self.client())

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
    """One voicewire turn: text in as it is pushed, audio out as the server sends it."""

    def __init__(self, *, tts: VoicewireTTS, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, conn_options=conn_options)
        self._vw_tts = tts
        self.turn: Turn | None = None  # the voicewire turn of the current attempt

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        output_emitter.initialize(
            request_id=utils.shortuuid(),
            sample_rate=self._vw_tts.sample_rate,
            num_channels=1,
            mime_type="audio/pcm",
            stream=True,
        )
        client = await self._vw_tts.client()
        turn = self.turn = await client.start_turn()
        segment_open = False

        async def send_text() -> None:
            nonlocal segment_open
            async for data in self._input_ch:
                if isinstance(data, self._FlushSentinel):
                    await turn.flush()
                    continue
                if not segment_open:
                    output_emitter.start_segment(segment_id=str(turn.turn_id))
                    segment_open = True
                self._mark_started()
                await turn.send(data)
            await turn.end()

        async def receive_audio() -> None:
            async for chunk in turn.audio():
                output_emitter.push(chunk.data)
            await turn.done()
            if segment_open:
                output_emitter.end_segment()

        tasks = [asyncio.create_task(send_text()), asyncio.create_task(receive_audio())]
        try:
            await asyncio.gather(*tasks)
        except VoicewireError as err:
            raise APIError(f"voicewire: {err}", retryable=err.code in RETRYABLE_CODES) from err
        finally:
            await utils.aio.cancel_and_wait(*tasks)
            if turn.result is None and not client.closed:
                # Closed early (an interruption, or an error): barge in. Not waiting for
                # turn.done keeps aclose() as quick as LiveKit expects.
                with contextlib.suppress(VoicewireError):
                    await turn.send_cancel()

    async def aclose(self) -> None:
        await super().aclose()
        self._vw_tts._streams.discard(self)
