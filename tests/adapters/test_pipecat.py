"""The Pipecat adapter inside a real Pipecat pipeline, against a real gateway and engine."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
from pipecat.frames.frames import (
    EndFrame,
    Frame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TTSAudioRawFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.workers.runner import WorkerRunner

from tests.asr import transcribe, wer
from tests.conftest import running_gateway
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


async def _run_pipeline(base: str, body: Any) -> tuple[VoicewireTTSService, Collector]:
    """Build [tts, collector], run it, let ``body(worker, collector)`` drive it, then end it."""
    tts = VoicewireTTSService(url=f"http://{base}")
    collector = Collector()
    worker = PipelineWorker(
        Pipeline([tts, collector]),
        params=PipelineParams(audio_out_sample_rate=24_000),
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

        tts, collector = await _run_pipeline(base, body)

    audio = collector.audio()
    late = [t for t, _ in audio if t > marks["interrupt"] + 0.05]
    assert not late, f"{len(late)} audio frames came {(late[-1] - marks['interrupt']) * 1000:.0f} ms after the interruption"
    assert marks["streams_left"] == 0
    done = [d for d in tts.finished_turns if d.reason == "cancelled"]
    assert len(done) == 1, list(tts.finished_turns)
    # Cut short: the server spoke a strict prefix of the reply, and said so.
    assert done[0].text_spoken and LONG_REPLY.startswith(done[0].text_spoken)
    assert len(done[0].text_spoken) < len(LONG_REPLY) / 2
    heard_s = sum(len(f.audio) for _, f in audio) / 2 / 24_000
    assert abs(heard_s * 1000 - done[0].played_ms) < 100
