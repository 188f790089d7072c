"""voicewire as a Pipecat TTS service (``pip install voicewire[pipecat]``).

    from voicewire.realtime.client.adapters.pipecat import VoicewireTTSService
    tts = VoicewireTTSService(url="http://127.0.0.1:8080")
    pipeline = Pipeline([transport.input(), stt, user_agg, llm, tts, transport.output(), assistant_agg])

One Pipecat turn context (an LLM reply, or a ``TTSSpeakFrame``) is one voicewire turn: the LLM's
text goes out as ``text.delta`` as it comes (``TextAggregationMode.TOKEN`` by default: voicewire's
own clause feeder starts speaking after a short first fragment, so Pipecat's sentence aggregation
would only add its ~200-300 ms per sentence), the end of the reply is ``text.end``, and the audio
comes back as ``TTSAudioRawFrame``s in the pipeline's output rate. An ``InterruptionFrame`` cancels
the turn (``turn.cancel``): the server drops its queued audio and frees the engine slot at once;
the turn's ``turn.done`` (``played_ms``, ``text_spoken``) lands in ``finished_turns``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncGenerator
from typing import Any

from pipecat.frames.frames import (
    CancelFrame,
    EndFrame,
    ErrorFrame,
    Frame,
    StartFrame,
    TTSAudioRawFrame,
    TTSStoppedFrame,
)
from pipecat.services.tts_service import TextAggregationMode, TTSService

from .. import Turn, TurnDone, VoicewireClient, VoicewireError

SERVER_RATES_HZ = (24_000, 48_000)  # what session.update offers; other pipeline rates are resampled here
FINISHED_TURNS_KEPT = 64


class VoicewireTTSService(TTSService):
    """Streams Pipecat's text frames to a voicewire server (protocol v1, WebSocket)."""

    def __init__(
        self,
        *,
        url: str = "http://127.0.0.1:8080",
        voice: str | None = None,
        api_key: str | None = None,
        text_aggregation_mode: TextAggregationMode = TextAggregationMode.TOKEN,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            text_aggregation_mode=text_aggregation_mode,
            push_start_frame=True,  # the base opens the audio context and sends TTSStartedFrame
            push_stop_frames=False,  # a turn's TTSStoppedFrame follows its turn.done
            **kwargs,
        )
        self._url = url
        self._voice = voice
        self._api_key = api_key
        self._client: VoicewireClient | None = None
        self._turns: dict[str, Turn] = {}  # Pipecat context id -> voicewire turn
        self._readers: dict[str, asyncio.Task[None]] = {}
        self.finished_turns: deque[TurnDone] = deque(maxlen=FINISHED_TURNS_KEPT)

    def can_generate_metrics(self) -> bool:
        return True

    # --- lifecycle ------------------------------------------------------------------------------
    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        await self._connect()

    async def stop(self, frame: EndFrame) -> None:
        await super().stop(frame)  # returns once every queued audio context has played
        await self._disconnect()

    async def cancel(self, frame: CancelFrame) -> None:
        await super().cancel(frame)
        await self._disconnect()

    async def _connect(self) -> None:
        if self._client is not None and not self._client.closed:
            return
        rate = self.sample_rate if self.sample_rate in SERVER_RATES_HZ else SERVER_RATES_HZ[0]
        self._client = await VoicewireClient.connect(
            self._url, sample_rate_hz=rate, voice=self._voice, api_key=self._api_key
        )
        await self._call_event_handler("on_connected")

    async def _disconnect(self) -> None:
        for task in self._readers.values():
            await self.cancel_task(task)
        self._readers.clear()
        self._turns.clear()
        if self._client is not None:
            await self._client.close()
            self._client = None
            await self._call_event_handler("on_disconnected")

    # --- text in ------------------------------------------------------------------------------------
    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        """Send one piece of the context's text; its audio arrives through ``_read``."""
        try:
            turn = self._turns.get(context_id)
            if turn is None:
                await self._connect()
                assert self._client is not None
                turn = await self._client.start_turn(turn_id=context_id)
                self._turns[context_id] = turn
                self._readers[context_id] = self.create_task(self._read(context_id, turn))
            await turn.send(text)
            await self.start_tts_usage_metrics(text)
        except (VoicewireError, OSError) as err:
            yield ErrorFrame(error=f"voicewire: {err}")
            yield TTSStoppedFrame(context_id=context_id)
            return
        yield None  # audio comes asynchronously, into the audio context

    async def flush_audio(self, context_id: str | None = None) -> None:
        """The reply ended: ``text.end`` (the server speaks what is left, then ``turn.done``)."""
        turn = self._turns.get(context_id or self.get_active_audio_context_id() or "")
        if turn is not None:
            await turn.end()

    async def on_audio_context_interrupted(self, context_id: str) -> None:
        """Barge-in: cancel the voicewire turn; its queued audio is dropped server-side."""
        await self.stop_all_metrics()
        turn = self._turns.pop(context_id, None)
        if turn is not None and self._client is not None and not self._client.closed:
            with contextlib.suppress(VoicewireError):
                # Not awaiting turn.done: the interruption must not wait for a round trip.
                await turn.send_cancel()
        await super().on_audio_context_interrupted(context_id)

    # --- audio out ----------------------------------------------------------------------------------
    async def _read(self, context_id: str, turn: Turn) -> None:
        assert self._client is not None
        server_rate = self._client.sample_rate_hz
        try:
            async for chunk in turn.audio():
                audio = chunk.data
                if server_rate != self.sample_rate:
                    audio = await self._resampler.resample(audio, server_rate, self.sample_rate)
                await self.append_to_audio_context(
                    context_id, TTSAudioRawFrame(audio, self.sample_rate, 1, context_id=context_id)
                )
            done = await turn.done()
        except VoicewireError as err:
            await self.push_error(error_msg=f"voicewire turn {context_id}: {err}", exception=err)
            done = None
        if done is not None:
            self.finished_turns.append(done)
        self._turns.pop(context_id, None)
        self._readers.pop(context_id, None)
        if self.audio_context_available(context_id):
            await self.stop_ttfb_metrics()
            await self.append_to_audio_context(context_id, TTSStoppedFrame(context_id=context_id))
            await self.remove_audio_context(context_id)
