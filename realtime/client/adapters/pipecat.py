"""voicewire as a Pipecat TTS service (``pip install voicewire[pipecat]``).

    from voicewire.realtime.client.adapters.pipecat import VoicewireTTSService
    tts = VoicewireTTSService(url="http://127.0.0.1:8080")
    pipeline = Pipeline([transport.input(), stt, user_agg, llm, tts, transport.output(), assistant_agg])

One Pipecat turn context (an LLM reply, or a ``TTSSpeakFrame``) is one voicewire turn: the LLM's
text goes out as ``text.delta`` as it comes (``TextAggregationMode.TOKEN`` by default: voicewire's
own clause feeder starts speaking after a short first fragment, so Pipecat's sentence aggregation
would only add its ~200-300 ms per sentence), the end of the reply is ``text.end``, and the audio
comes back as ``TTSAudioRawFrame``s in the pipeline's output rate.

Word timestamps: the server's ``turn.words`` become Pipecat word timestamps
(``add_word_timestamps``), as Pipecat's own word-timestamp services do, so each word's
``TTSTextFrame`` leaves the output transport when its audio plays and the assistant context
aggregator holds only the words the listener heard when an ``InterruptionFrame`` comes. The
interruption cancels the turn (``turn.cancel`` with the position Pipecat played to): the server
drops its queued audio, frees the engine slot and reports ``text_spoken`` at that position; the
turn's account lands in ``finished_turns``. A reply the server had finished sending before the
interruption (its audio context complete, its audio still playing downstream) stays ``completed``
there, with the ``played_ms`` and ``text_spoken`` of the position reported (``turn.truncated``).
The interrupted LLM's text frames that still come after the ``InterruptionFrame`` are dropped
until the next reply starts (``LLMFullResponseStartFrame``) or that one ends; text outside any
reply is a turn of its own, ended with it.

Settings (``VoicewireTTSService.Settings``, Pipecat's ``TTSSettings``): ``voice`` (None: the
server's default; a ``TTSUpdateSettingsFrame`` changes it for the turns after it); ``model`` and
``language`` are None, since the server decides them (``voicewire serve --model``), not a session.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from pipecat.frames.frames import (
    CancelFrame,
    EndFrame,
    ErrorFrame,
    Frame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    StartFrame,
    TTSAudioRawFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
)
from pipecat.processors.frame_processor import FrameDirection
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TextAggregationMode, TTSService

from .. import Turn, TurnDone, TurnWords, VoicewireClient, VoicewireError

SERVER_RATES_HZ = (24_000, 48_000)  # what session.update offers; other pipeline rates are resampled here
FINISHED_TURNS_KEPT = 64
# Turns whose audio was all pushed downstream but may still be playing there: an interruption
# reports their position too (the server keeps its last 4 finished turns for that).
PLAYING_OUT_KEPT = 4


@dataclass
class _Speech:
    """One Pipecat audio context as a voicewire turn, and what the service knows of its playback."""

    turn: Turn
    reader: asyncio.Task[None] | None = None
    text: str = ""  # the text sent, joined: what the word timings' char offsets index
    t_first_text_s: float = 0.0  # time.time() of the first text.delta (Pipecat's metrics clock)
    t_first_audio_s: float = 0.0  # time.time() when its first audio arrived
    pushed_s: float = 0.0  # audio pushed downstream
    playout_end_s: float | None = None  # time.monotonic() that audio has played out by (None: none pushed)


class VoicewireTTSService(TTSService):
    """Streams Pipecat's text frames to a voicewire server (protocol v1, WebSocket)."""

    Settings = TTSSettings
    _settings: TTSSettings

    def __init__(
        self,
        *,
        url: str = "http://127.0.0.1:8080",
        voice: str | None = None,
        api_key: str | None = None,
        settings: TTSSettings | None = None,
        text_aggregation_mode: TextAggregationMode = TextAggregationMode.TOKEN,
        **kwargs: Any,
    ) -> None:
        # Every field given (Pipecat checks at start that none is NOT_GIVEN); ``settings`` wins.
        store = TTSSettings(model=None, voice=voice, language=None)
        if settings is not None:
            store.apply_update(settings)
        super().__init__(
            text_aggregation_mode=text_aggregation_mode,
            # Word frames come from the server's word timings, as each word plays.
            push_text_frames=False,
            # run_tts opens each audio context itself: the base would also start a TTFB
            # measurement there and stop it when the context's audio reaches the head of the
            # playback queue, so a turn queued behind another would count that one's playback.
            push_start_frame=False,
            push_stop_frames=False,  # a turn's TTSStoppedFrame follows its turn.done
            settings=store,
            **kwargs,
        )
        self._url = url
        self._api_key = api_key
        self._client: VoicewireClient | None = None
        self._speeches: dict[str, _Speech] = {}  # Pipecat context id -> its voicewire turn
        # When the audio pushed downstream so far has played out (time.monotonic()), for a
        # listener that plays each frame in order, in real time, from when it is pushed (what an
        # output transport does): a cancel reports the position this gives.
        self._playout_end_s = 0.0
        self._playing_out: deque[_Speech] = deque(maxlen=PLAYING_OUT_KEPT)
        # An interruption ends the reply; the interrupted LLM's text frames that still come (until
        # the next reply starts or this one's end frame) are dropped: outside a turn context each
        # would open a voicewire turn of its own that nothing ends.
        self._reply_interrupted = False
        self.finished_turns: deque[TurnDone] = deque(maxlen=FINISHED_TURNS_KEPT)

    def can_generate_metrics(self) -> bool:
        return True

    @property
    def supports_processing_metrics(self) -> bool:
        return False  # run_tts only hands text off; TTFB and TTFA carry the latency

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
        voice = self._settings.voice
        self._client = await VoicewireClient.connect(
            self._url,
            sample_rate_hz=rate,
            voice=voice if isinstance(voice, str) else None,
            api_key=self._api_key,
        )
        await self._call_event_handler("on_connected")

    async def _disconnect(self) -> None:
        for speech in self._speeches.values():
            if speech.reader is not None:
                await self.cancel_task(speech.reader)
        self._speeches.clear()
        if self._client is not None:
            await self._client.close()
            self._client = None
            await self._call_event_handler("on_disconnected")

    async def _update_settings(self, delta: TTSSettings) -> dict[str, Any]:  # type: ignore[override]
        changed = await super()._update_settings(delta)
        if "voice" in changed and self._client is not None and not self._client.closed:
            # The session's voice: turns opened after this speak with it.
            await self._client.send_message({"type": "session.update", "voice": self._settings.voice or ""})
        self._warn_unhandled_updated_settings(changed.keys() - {"voice"})
        return changed

    # --- text in ------------------------------------------------------------------------------------
    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        if isinstance(frame, InterruptionFrame):
            self._reply_interrupted = True
            await self._report_played_out()
        elif isinstance(frame, LLMTextFrame) and self._reply_interrupted:
            return  # the rest of the reply the listener interrupted
        elif isinstance(frame, (LLMFullResponseStartFrame, LLMFullResponseEndFrame)):
            self._reply_interrupted = False
        await super().process_frame(frame, direction)

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        """Send one piece of the context's text; its audio and words arrive through ``_read``."""
        try:
            speech = self._speeches.get(context_id)
            if speech is None:
                await self._connect()
                assert self._client is not None
                speech = _Speech(await self._client.start_turn(turn_id=context_id))
                self._speeches[context_id] = speech
                await self.create_audio_context(context_id)
                yield TTSStartedFrame(context_id=context_id)
                speech.reader = self.create_task(self._read(context_id, speech))
            if not speech.text:
                speech.t_first_text_s = time.time()
            speech.text += text
            await speech.turn.send(text)
            if context_id != self._turn_context_id:
                # Text outside a reply (no LLMFullResponseStartFrame before it) is a context of its
                # own that no reply end flushes: its turn ends with it.
                await speech.turn.end()
        except (VoicewireError, OSError) as err:
            yield ErrorFrame(error=f"voicewire: {err}")
            yield TTSStoppedFrame(context_id=context_id)
            return
        yield None  # audio comes asynchronously, into the audio context

    async def flush_audio(self, context_id: str | None = None) -> None:
        """The reply ended: ``text.end`` (the server speaks what is left, then ``turn.done``)."""
        speech = self._speeches.get(context_id or self.get_active_audio_context_id() or "")
        if speech is not None:
            await speech.turn.end()

    async def on_audio_context_interrupted(self, context_id: str) -> None:
        """Barge-in: cancel the voicewire turn at the position played; the server drops the rest."""
        await self.stop_all_metrics()
        speech = self._speeches.pop(context_id, None)
        if speech is not None:
            await self._report_played(speech)
        self._playout_end_s = 0.0  # the output transport drops what it had not played
        await super().on_audio_context_interrupted(context_id)

    async def on_audio_context_completed(self, context_id: str) -> None:
        speech = self._speeches.pop(context_id, None)
        if speech is not None:
            self._playing_out.append(speech)
        await super().on_audio_context_completed(context_id)

    async def _report_played_out(self) -> None:
        """An interruption while turns whose audio contexts completed still play downstream: the
        server finished them, and learns here how much the listener heard (``turn.truncated``)."""
        now_s = time.monotonic()
        playing = [s for s in self._playing_out if s.playout_end_s is not None and s.playout_end_s > now_s]
        self._playing_out.clear()
        for speech in playing:
            await self._report_played(speech)

    async def _report_played(self, speech: _Speech) -> None:
        """``turn.cancel`` at the position played (the server drops what is queued, or truncates a
        turn it finished); the answer lands in ``finished_turns``."""
        if self._client is None or self._client.closed:
            return
        played_ms = 0.0
        if speech.playout_end_s is not None:
            unplayed_s = max(0.0, speech.playout_end_s - time.monotonic())
            played_ms = max(0.0, speech.pushed_s - unplayed_s) * 1000
        with contextlib.suppress(VoicewireError):
            # Not awaiting the answer: no round trip in the interruption.
            await speech.turn.send_cancel(played_ms=played_ms)
        if speech.reader is None:  # its reader has recorded turn.done already
            self.create_task(self._record_played(speech.turn))

    async def _record_played(self, turn: Turn) -> None:
        with contextlib.suppress(VoicewireError, TimeoutError):
            self._record(await turn.played())

    def _record(self, done: TurnDone) -> None:
        """``done`` into ``finished_turns``, in place of the turn's earlier account."""
        for i, old in enumerate(self.finished_turns):
            if old.turn_id == done.turn_id:
                self.finished_turns[i] = done
                return
        self.finished_turns.append(done)

    # --- audio and words out ------------------------------------------------------------------------
    async def _read(self, context_id: str, speech: _Speech) -> None:
        assert self._client is not None
        server_rate = self._client.sample_rate_hz
        done: TurnDone | None = None
        try:
            async for event in speech.turn.events():
                if isinstance(event, TurnWords):
                    await self._promote_sent_text(context_id)
                    # The words as the text has them (the sequencer matches them against it),
                    # timed from the turn's first sample, which is its audio context's first.
                    words = [(speech.text[w.char_start : w.char_end], w.start_ms / 1000) for w in event.words]
                    await self.add_word_timestamps([(w, t) for w, t in words if w], context_id)
                    continue
                if not speech.t_first_audio_s:
                    speech.t_first_audio_s = time.time()
                audio = event.data
                if server_rate != self.sample_rate:
                    audio = await self._resampler.resample(audio, server_rate, self.sample_rate)
                await self.append_to_audio_context(
                    context_id, TTSAudioRawFrame(audio, self.sample_rate, 1, context_id=context_id)
                )
            await speech.turn.done()
            done = await speech.turn.played()  # with the position an interruption reported, if any
        except (VoicewireError, TimeoutError) as err:
            await self.push_error(error_msg=f"voicewire turn {context_id}: {err}", exception=err)
        if done is not None:
            self._record(done)
        speech.reader = None
        if self.audio_context_available(context_id):
            await self.append_to_audio_context(context_id, TTSStoppedFrame(context_id=context_id))
            await self.remove_audio_context(context_id)

    async def _promote_sent_text(self, context_id: str) -> None:
        """Make the text sent so far a unit the words can complete, before the words come.

        Streaming tokens, Pipecat gathers them back into sentences and holds a sentence's words
        until the next sentence begins (or the reply ends); an interruption drops what it holds,
        so a reply cut inside its first long sentence would leave no word in the context, however
        much of it played. The server times only text it has committed to speak, so each
        ``turn.words`` closes the pending text as Pipecat's own reply end does (and Cartesia's
        service on a voice change); the bot-output segments are then clauses, not sentences.
        """
        if self._is_streaming_tokens:
            frames = await self._aggregated_frame_sequencer.finalize(context_id)
            await self._push_sequencer_frames(frames, context_id)

    async def push_frame(self, frame: Frame, direction: FrameDirection = FrameDirection.DOWNSTREAM) -> None:
        speech = self._speeches.get(frame.context_id or "") if isinstance(frame, TTSAudioRawFrame) else None
        if speech is not None:
            assert isinstance(frame, TTSAudioRawFrame)
            now_s = time.monotonic()
            duration_s = len(frame.audio) / 2 / frame.sample_rate
            if speech.playout_end_s is None:
                await self._report_latency(speech, frame)
            self._playout_end_s = max(self._playout_end_s, now_s) + duration_s
            speech.playout_end_s = self._playout_end_s
            speech.pushed_s += duration_s
        await super().push_frame(frame, direction)

    async def _report_latency(self, speech: _Speech, first: TTSAudioRawFrame) -> None:
        """TTFB from the turn's own first text to its own first audio, and TTFA from its audio;
        reported as its audio starts downstream, so a turn queued behind another still reports
        its own latency, after that turn's."""
        await self.start_ttfb_metrics(start_time=speech.t_first_text_s)
        await self.stop_ttfb_metrics(end_time=speech.t_first_audio_s or time.time())
        # The base scans the frames after this one for the audible onset.
        await self.process_ttfa_metrics(first)
