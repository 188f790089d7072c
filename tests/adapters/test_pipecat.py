"""The Pipecat adapter inside a real Pipecat pipeline, against a real gateway and engine."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest
from loguru import logger
from pipecat.frames.frames import (
    EndFrame,
    Frame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    MetricsFrame,
    OutputAudioRawFrame,
    StartFrame,
    TTSAudioRawFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
    TTSUpdateSettingsFrame,
)
from pipecat.metrics.metrics import TTFAMetricsData, TTFBMetricsData
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.settings import TTSSettings
from pipecat.transports.base_output import BaseOutputTransport
from pipecat.transports.base_transport import TransportParams
from pipecat.workers.runner import WorkerRunner

from tests.asr import transcribe, wer
from tests.conftest import running_gateway
from tests.realtime.gateway import gateway
from voicewire.engine import Engine
from voicewire.realtime.client.adapters.pipecat import VoicewireTTSService

REPLY = "Your appointment is confirmed for Tuesday at ten in the morning."
LONG_REPLY = (
    "Thanks for calling, I can help with that. Your order shipped this morning and the tracking "
    "number is on its way to your inbox. It should arrive by Thursday, and you can change the "
    "delivery address until tomorrow evening."
)


class Collector(FrameProcessor):
    """The end of the pipeline: records what reaches it, with arrival times."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: list[tuple[float, Frame]] = []
        self.arrived = asyncio.Event()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if direction == FrameDirection.DOWNSTREAM:
            self.frames.append((time.perf_counter(), frame))
            self.arrived.set()
        await self.push_frame(frame, direction)

    def audio(self) -> list[tuple[float, TTSAudioRawFrame]]:
        return [(t, f) for t, f in self.frames if isinstance(f, TTSAudioRawFrame)]

    async def wait_for(self, kind: type, timeout_s: float = 20.0) -> float:
        deadline = time.perf_counter() + timeout_s
        while True:
            for t, f in self.frames:
                if isinstance(f, kind):
                    return t
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), max(0.01, deadline - time.perf_counter()))


class Speaker(BaseOutputTransport):
    """An output transport whose device plays at real time: each write returns once its audio has
    played, like the blocking write of Pipecat's local audio transport, so frames timed by PTS
    (word frames) leave it as their audio plays and an interruption drops what is unplayed."""

    def __init__(self) -> None:
        super().__init__(TransportParams(audio_out_enabled=True))
        self.writes: list[tuple[float, OutputAudioRawFrame]] = []  # (perf_counter as it starts, frame)
        self._next_s = 0.0

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        await self.set_transport_ready(frame)

    async def write_audio_frame(self, frame: OutputAudioRawFrame) -> bool:
        now = time.perf_counter()
        duration_s = len(frame.audio) / 2 / frame.sample_rate
        self.writes.append((now, frame))
        self._next_s = max(self._next_s, now) + duration_s
        await asyncio.sleep(self._next_s - now)
        return True

    def heard(self, until: float) -> np.ndarray:
        """The PCM (int16) played until ``until`` (perf_counter)."""
        parts = []
        for t, frame in self.writes:
            samples = np.frombuffer(frame.audio, "<i2")
            parts.append(samples[: max(0, round((until - t) * frame.sample_rate))])
        return np.concatenate(parts) if parts else np.zeros(0, np.int16)


async def _run_pipeline(
    base: str, body: Any, processors: list[FrameProcessor] | None = None, **params: Any
) -> tuple[VoicewireTTSService, Collector]:
    """Build [tts, *processors, collector], run it, let ``body(worker, collector)`` drive it, then
    end it."""
    tts = VoicewireTTSService(url=f"http://{base}")
    collector = Collector()
    worker = PipelineWorker(
        Pipeline([tts, *(processors or []), collector]),
        params=PipelineParams(audio_out_sample_rate=24_000, **params),
        cancel_on_idle_timeout=False,
    )
    started = asyncio.Event()

    @worker.event_handler("on_pipeline_started")
    async def _started(worker: Any, frame: Any) -> None:
        started.set()

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    run = asyncio.create_task(runner.run())
    try:
        await asyncio.wait_for(started.wait(), 10)
        await body(worker, collector)
        await worker.queue_frame(EndFrame())
        await asyncio.wait_for(run, 20)
    finally:
        if not run.done():
            await worker.cancel()
            await asyncio.wait_for(run, 10)
    return tts, collector


async def _say(worker: PipelineWorker, text: str, words_per_s: float) -> None:
    """What an LLM service pushes for one reply: start, one text frame per word, end."""
    await worker.queue_frame(LLMFullResponseStartFrame())
    for i, word in enumerate(text.split(" ")):
        await worker.queue_frame(LLMTextFrame(word if i == 0 else " " + word))
        await asyncio.sleep(1 / words_per_s)
    await worker.queue_frame(LLMFullResponseEndFrame())


async def test_pipeline_speaks_a_reply_as_tts_audio_frames(engine: Engine) -> None:
    async with running_gateway(engine) as base:

        async def body(worker: PipelineWorker, collector: Collector) -> None:
            await _say(worker, REPLY, words_per_s=30)
            await collector.wait_for(TTSStoppedFrame)

        tts, collector = await _run_pipeline(base, body)

    kinds = [type(f) for _, f in collector.frames]
    assert TTSStartedFrame in kinds and TTSStoppedFrame in kinds
    assert kinds.index(TTSStartedFrame) < kinds.index(TTSAudioRawFrame) < kinds.index(TTSStoppedFrame)
    frames = [f for _, f in collector.audio()]
    assert frames and all(f.sample_rate == 24_000 and f.num_channels == 1 for f in frames)
    pcm = np.frombuffer(b"".join(f.audio for f in frames), "<i2").astype(np.float32) / 32768.0
    assert 2.0 < pcm.size / 24_000 < 8.0
    heard = transcribe(pcm, 24_000)
    assert wer(REPLY, heard) <= 0.15, heard
    done = tts.finished_turns[-1]
    assert done.reason == "completed" and done.text_spoken == REPLY


async def test_interruption_frame_cancels_the_turn(engine: Engine) -> None:
    marks: dict[str, float] = {}
    speaker = Speaker()
    async with running_gateway(engine) as base:

        async def body(worker: PipelineWorker, collector: Collector) -> None:
            # An LLM slower than speech, so the turn is still going when the user barges in.
            speaking = asyncio.create_task(_say(worker, LONG_REPLY, words_per_s=8))
            marks["first_audio"] = await collector.wait_for(TTSAudioRawFrame)
            await asyncio.sleep(0.8)
            marks["interrupt"] = time.perf_counter()
            await worker.queue_frame(InterruptionFrame())
            speaking.cancel()  # the LLM service is interrupted too
            await asyncio.sleep(1.0)  # anything still coming would arrive by now
            for _ in range(100):  # the server confirmed the cancel and freed the engine slot
                if engine.active_streams() == 0:
                    break
                await asyncio.sleep(0.02)
            marks["streams_left"] = engine.active_streams()

        tts, collector = await _run_pipeline(base, body, [speaker])

    audio = collector.audio()
    late = [t for t, _ in audio if t > marks["interrupt"] + 0.05]
    assert not late, (
        f"{len(late)} audio frames came {(late[-1] - marks['interrupt']) * 1000:.0f} ms after the interruption"
    )
    assert marks["streams_left"] == 0
    done = [d for d in tts.finished_turns if d.reason == "cancelled"]
    assert len(done) == 1, list(tts.finished_turns)
    # Cut short: the server spoke a strict prefix of the reply, and said so.
    assert done[0].text_spoken and LONG_REPLY.startswith(done[0].text_spoken)
    assert len(done[0].text_spoken) < len(LONG_REPLY) / 2
    # The cancel said how far the listener got, and the server cut the turn there.
    heard_s = speaker.heard(marks["interrupt"]).size / 24_000
    assert done[0].played_source == "client" and abs(heard_s * 1000 - done[0].played_ms) < 100


async def test_each_of_two_back_to_back_turns_reports_its_own_ttfb_and_ttfa(engine: Engine) -> None:
    first, second = REPLY, "And a reminder will reach your phone the evening before."
    marks: dict[str, float] = {}
    async with running_gateway(engine) as base:

        async def body(worker: PipelineWorker, collector: Collector) -> None:
            # The second reply comes while the first still plays: its audio waits behind it.
            await _say(worker, first, words_per_s=30)
            await collector.wait_for(TTSAudioRawFrame)
            marks["second"] = time.perf_counter()
            await _say(worker, second, words_per_s=30)
            while sum(isinstance(f, TTSStoppedFrame) for _, f in collector.frames) < 2:
                await collector.wait_for(TTSStoppedFrame)
                await asyncio.sleep(0.05)

        tts, collector = await _run_pipeline(base, body, [Speaker()], enable_metrics=True)

    def metrics(kind: type) -> list[Any]:
        return [
            d
            for _, f in collector.frames
            if isinstance(f, MetricsFrame)
            for d in f.data
            if isinstance(d, kind) and d.processor == tts.name
        ]

    # Pipecat reports a zero TTFB for every processor at start; the turns' own come after.
    ttfb = [d.value for d in metrics(TTFBMetricsData) if d.value > 0]
    ttfa = [d.ttfa for d in metrics(TTFAMetricsData)]
    done = list(tts.finished_turns)
    print(f"TTFB {ttfb}, TTFA {ttfa}, server TTFP {[d.metrics.get('ttfp_ms') for d in done]}")
    assert len(ttfb) == 2 and len(ttfa) == 2
    # Each turn's own latency, first text to first audio: what the server measured for it (its
    # TTFP, plus the loopback hop), not the wait behind the other turn (which plays for over 2 s
    # after the second is sent), nor a stray measurement cut short by the first turn's end.
    ttfp = [d.metrics["ttfp_ms"] / 1000 for d in done]
    assert all(abs(b - p) < 0.05 for b, p in zip(ttfb, ttfp, strict=True)), (ttfb, ttfp)
    assert all(b <= a < b + 0.5 for a, b in zip(ttfa, ttfb, strict=True)), (ttfa, ttfb)
    assert [d.reason for d in done] == ["completed", "completed"]


async def test_no_error_or_warning_is_logged_from_start_to_a_spoken_turn(engine: Engine) -> None:
    records: list[str] = []
    sink = logger.add(lambda m: records.append(str(m)), level="WARNING")
    try:
        async with running_gateway(engine) as base:

            async def body(worker: PipelineWorker, collector: Collector) -> None:
                await _say(worker, REPLY, words_per_s=30)
                await collector.wait_for(TTSStoppedFrame)

            tts, _ = await _run_pipeline(base, body, [Speaker()], enable_metrics=True)
    finally:
        logger.remove(sink)
    assert tts.finished_turns[-1].reason == "completed"
    assert not records, "".join(records)


SENTENCE = (  # one sentence of short clauses: an LLM at 20 words/s stays ahead of speech
    "Thanks for calling today, my name is Avery, and I will be glad to help you, step by step, "
    "with moving your account to the new plan, before the end of the month, without any extra "
    "cost, and with all of your saved settings, your contacts, and your history kept as they are."
)


def _words(text: str) -> list[str]:
    return [w.strip(".,?!").lower() for w in text.split()]


@pytest.mark.parametrize(
    "words_per_s",
    [
        # An LLM faster than speech, still streaming when the user barges in: the server cancels
        # the turn at the position the adapter reports.
        pytest.param(20, id="reply-streaming"),
        # The whole reply in at once: generated and sent long before it plays, the turn has
        # completed on the server, and only the word timings tell what the listener heard.
        pytest.param(60, id="reply-all-sent"),
    ],
)
async def test_interruption_keeps_only_the_played_words_in_the_assistant_context(
    engine: Engine, words_per_s: float
) -> None:
    context = LLMContext(messages=[{"role": "user", "content": "Can you move my account?"}])
    pair = LLMContextAggregatorPair(context)
    speaker = Speaker()
    marks: dict[str, float] = {}
    async with running_gateway(engine) as base:

        async def body(worker: PipelineWorker, collector: Collector) -> None:
            speaking = asyncio.create_task(_say(worker, SENTENCE, words_per_s=words_per_s))
            while not speaker.writes:
                await asyncio.sleep(0.005)
            await asyncio.sleep(1.5 - (time.perf_counter() - speaker.writes[0][0]))
            marks["interrupt"] = time.perf_counter()
            await worker.queue_frame(InterruptionFrame())
            speaking.cancel()  # the LLM service is interrupted too
            await asyncio.sleep(1.0)

        tts, _ = await _run_pipeline(base, body, [speaker, pair.assistant()])

    pcm = speaker.heard(marks["interrupt"])
    heard_s = pcm.size / 24_000
    heard = transcribe(pcm.astype(np.float32) / 32768.0, 24_000)
    played = [m for m in context.messages if isinstance(m, dict) and m.get("role") == "assistant"]
    assert len(played) == 1, context.messages
    kept = str(played[0].get("content"))
    done = tts.finished_turns[-1]
    print(
        f"heard {heard_s:.2f} s {heard!r}; context {kept!r}; server {done.played_ms:.0f} ms {done.text_spoken!r}"
    )
    assert 1.2 < heard_s < 1.6  # 1.5 s, less any stall of the 2 shared cores
    # The context holds a prefix of the reply with as many words as the listener heard (Whisper
    # on the played audio), give or take the word that was playing.
    assert SENTENCE.startswith(kept), kept
    assert abs(len(_words(kept)) - len(_words(heard))) <= 1
    # The server cut text_spoken at the position the adapter reported, what the speaker played:
    # a turn still streaming is cancelled there; one it had finished sending is truncated there.
    assert done.reason == ("cancelled" if words_per_s < 30 else "completed")
    assert done.played_source == "client"
    # The adapter times the speaker as real time from each push; a stall of the shared cores
    # delays the speaker (heard_s above), not that clock.
    assert abs(done.played_ms - heard_s * 1000) < 150
    assert SENTENCE.startswith(done.text_spoken)
    assert abs(len(_words(kept)) - len(_words(done.text_spoken))) <= 1
    assert abs(len(_words(heard)) - len(_words(done.text_spoken))) <= 1


async def test_a_voice_update_reaches_the_server_session(engine: Engine) -> None:
    voices: list[str] = []
    async with gateway(engine) as gw:

        async def body(worker: PipelineWorker, collector: Collector) -> None:
            # The embedded voice's one voice, by name: the session's voice is "" (default) until then.
            await worker.queue_frame(TTSUpdateSettingsFrame(delta=TTSSettings(voice="heart")))
            await _say(worker, REPLY, words_per_s=30)
            await collector.wait_for(TTSStoppedFrame)
            voices.extend(s.audio.voice for s in gw.sessions)

        tts, _ = await _run_pipeline(gw.url.removeprefix("http://"), body)
    assert isinstance(tts.settings, TTSSettings) and tts.settings.voice == "heart"
    assert voices == ["heart"]
    assert tts.finished_turns[-1].reason == "completed"


async def test_text_after_an_interruption_opens_no_turn_and_the_next_reply_speaks(engine: Engine) -> None:
    """The interrupted LLM's last text frames come after the InterruptionFrame, with no new
    response start: outside a turn context, each would open a voicewire turn that nothing ends,
    until the session refuses new turns (too_many_turns) and every later reply is silent."""
    open_turns: list[int] = []
    records: list[str] = []
    sink = logger.add(lambda m: records.append(str(m)), level="ERROR")
    try:
        async with gateway(engine) as gw:

            async def body(worker: PipelineWorker, collector: Collector) -> None:
                await worker.queue_frame(LLMFullResponseStartFrame())
                await worker.queue_frame(LLMTextFrame("Let me check that for you,"))
                await collector.wait_for(TTSAudioRawFrame)
                await worker.queue_frame(InterruptionFrame())
                for word in LONG_REPLY.split(" ")[:12]:
                    await worker.queue_frame(LLMTextFrame(" " + word))
                await asyncio.sleep(1.0)
                open_turns.append(sum(s.open_turns for s in gw.sessions))
                collector.frames.clear()
                await _say(worker, REPLY, words_per_s=30)
                await collector.wait_for(TTSStoppedFrame)
                await asyncio.sleep(0.3)
                open_turns.append(sum(s.open_turns for s in gw.sessions))

            tts, collector = await _run_pipeline(gw.url.removeprefix("http://"), body, [Speaker()])
    finally:
        logger.remove(sink)
    assert open_turns == [0, 0], open_turns
    assert not records, "".join(records)
    pcm = np.frombuffer(b"".join(f.audio for _, f in collector.audio()), "<i2").astype(np.float32) / 32768.0
    heard = transcribe(pcm, 24_000)
    assert wer(REPLY, heard) <= 0.15, heard
    assert tts.finished_turns[-1].reason == "completed" and tts.finished_turns[-1].text_spoken == REPLY
