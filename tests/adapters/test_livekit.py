"""The LiveKit Agents adapter: a real SynthesizeStream against a real gateway and engine."""

from __future__ import annotations

import asyncio
import logging
import time

import numpy as np
import pytest
from livekit.agents import APIConnectionError, APIError, APIStatusError, tts
from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT, APIConnectOptions, TimedString

from tests.asr import transcribe, wer
from tests.conftest import free_port, running_gateway
from voicewire.engine import Engine
from voicewire.realtime.auth import AuthConfig
from voicewire.realtime.client.adapters.livekit import VoicewireTTS

REPLY = "The package left our warehouse yesterday and should arrive soon."
LONG_REPLY = (
    "Thanks for calling, I can help with that. Your order shipped this morning and the tracking "
    "number is on its way to your inbox. It should arrive by Thursday, and you can change the "
    "delivery address until tomorrow evening."
)


async def _next(it: tts.SynthesizeStream, timeout_s: float) -> tts.SynthesizedAudio | None:
    """The next event, or None when the stream ended."""
    try:
        return await asyncio.wait_for(it.__anext__(), timeout_s)
    except StopAsyncIteration:
        return None


async def test_stream_speaks_pushed_text_on_flush_and_ends_on_end_input(engine: Engine) -> None:
    async with running_gateway(engine) as base:
        voice = VoicewireTTS(url=f"http://{base}")
        stream = voice.stream()
        for word in REPLY.split(" "):
            stream.push_text(word + " ")
            await asyncio.sleep(0.02)
        stream.flush()

        frames: list[tts.SynthesizedAudio] = []
        pending = asyncio.ensure_future(stream.__anext__())
        # Audio for everything pushed comes after flush alone; the stream stays open.
        while True:
            done, _ = await asyncio.wait({pending}, timeout=1.0)
            if not done:
                break  # a second without audio: all of it has come
            frames.append(pending.result())
            pending = asyncio.ensure_future(stream.__anext__())
        assert frames, "no audio after push_text + flush"
        assert not pending.done(), "the stream ended before end_input"

        t_end = time.perf_counter()
        stream.end_input()
        rest: list[tts.SynthesizedAudio] = []
        try:
            rest.append(await asyncio.wait_for(pending, 5.0))
            while (ev := await _next(stream, 5.0)) is not None:
                rest.append(ev)
        except StopAsyncIteration:
            pass
        ended_s = time.perf_counter() - t_end
        await stream.aclose()
        await voice.aclose()

    assert ended_s < 1.0
    frames += rest
    assert all(f.frame.sample_rate == 24_000 and f.frame.num_channels == 1 for f in frames)
    assert frames[-1].is_final
    pcm = np.concatenate([np.frombuffer(f.frame.data, np.int16) for f in frames]).astype(np.float32) / 32768.0
    assert 2.0 < pcm.size / 24_000 < 8.0
    heard = transcribe(pcm, 24_000)
    assert wer(REPLY, heard) <= 0.15, heard
    assert stream.turn is not None and (await stream.turn.done()).reason == "completed"


async def test_closing_the_stream_mid_speech_cancels_the_turn(engine: Engine) -> None:
    async with running_gateway(engine) as base:
        voice = VoicewireTTS(url=f"http://{base}")
        stream = voice.stream()

        async def llm() -> None:  # slower than speech: the turn is still open when the user barges in
            for word in LONG_REPLY.split(" "):
                stream.push_text(word + " ")
                await asyncio.sleep(1 / 8)

        feeding = asyncio.create_task(llm())
        first = await _next(stream, 10.0)
        assert first is not None
        received_s = first.frame.duration
        t_first = time.perf_counter()
        while time.perf_counter() - t_first < 0.8:
            ev = await _next(stream, 5.0)
            assert ev is not None
            received_s += ev.frame.duration
        feeding.cancel()
        t_close = time.perf_counter()
        await stream.aclose()  # what LiveKit does when the agent is interrupted
        assert stream.turn is not None
        done = await stream.turn.done(timeout_s=2.0)
        for _ in range(100):
            if engine.active_streams() == 0:
                break
            await asyncio.sleep(0.02)
        streams_left = engine.active_streams()
        await voice.aclose()

    assert done.reason == "cancelled"
    assert streams_left == 0
    assert done.text_spoken and LONG_REPLY.startswith(done.text_spoken)
    assert len(done.text_spoken) < len(LONG_REPLY) / 2
    # The cancel reports what a listener playing from the first frame at real time has heard by
    # then (the adapter saw the first audio a little before this reader did).
    heard_s = min(t_close - t_first, received_s)
    assert done.played_source == "client"
    assert heard_s * 1000 - 50 < done.played_ms < heard_s * 1000 + 150, (done.played_ms, heard_s)


async def test_synthesize_runs_through_the_stream(engine: Engine) -> None:
    async with running_gateway(engine) as base:
        voice = VoicewireTTS(url=f"http://{base}")
        voice.prewarm()
        async with voice.synthesize("Hello there.") as chunked:
            frame = await chunked.collect()
        await voice.aclose()
    assert frame.sample_rate == 24_000 and 0.5 < frame.duration < 3.0


async def _speak(stream: tts.SynthesizeStream, text: str) -> list[tts.SynthesizedAudio]:
    """Push ``text`` a word at a time as an LLM would, end the input, read the stream to its end."""
    for word in text.split(" "):
        stream.push_text(word + " ")
    stream.end_input()
    return [ev async for ev in stream]


def _pcm(events: list[tts.SynthesizedAudio]) -> np.ndarray:
    return (
        np.concatenate([np.frombuffer(e.frame.data, np.int16) for e in events]).astype(np.float32) / 32768.0
    )


async def test_a_16_khz_stream_is_resampled_and_intelligible(engine: Engine) -> None:
    async with running_gateway(engine) as base:
        voice = VoicewireTTS(url=f"http://{base}", sample_rate=16_000)
        async with voice.stream() as stream:
            events = await _speak(stream, REPLY)
        await voice.aclose()
    assert events and all(e.frame.sample_rate == 16_000 and e.frame.num_channels == 1 for e in events)
    assert events[-1].is_final
    pcm = _pcm(events)
    assert 2.0 < pcm.size / 16_000 < 8.0
    heard = transcribe(pcm, 16_000)
    assert wer(REPLY, heard) <= 0.15, heard


@pytest.mark.parametrize("sample_rate", [0, -16_000, 16_000.0])
def test_a_sample_rate_that_is_no_rate_is_refused_at_construction(sample_rate: object) -> None:
    with pytest.raises(ValueError, match="sample_rate"):
        VoicewireTTS(sample_rate=sample_rate)  # type: ignore[arg-type]


NO_RETRY = APIConnectOptions(max_retry=0, timeout=5.0)


async def _first_error(voice: VoicewireTTS) -> APIError:
    with pytest.raises(APIError) as caught:
        async with voice.stream(conn_options=NO_RETRY) as stream:
            await _speak(stream, REPLY)
    await voice.aclose()
    return caught.value


async def test_errors_are_livekit_api_errors(engine: Engine) -> None:
    # Nothing listens: a connection error, which LiveKit may retry.
    err = await _first_error(VoicewireTTS(url=f"http://127.0.0.1:{free_port()}"))
    assert isinstance(err, APIConnectionError) and err.retryable
    # A wrong key: refused with 401 at the handshake, never retried.
    async with running_gateway(engine, auth=AuthConfig(api_keys=("k" * 24,))) as base:
        err = await _first_error(VoicewireTTS(url=f"http://{base}", api_key="w" * 24))
    assert isinstance(err, APIStatusError) and err.status_code == 401 and not err.retryable
    assert err.body == {"code": "invalid_api_key", "message": err.body["message"]}  # type: ignore[index]
    # The server is full: 503, worth a retry.
    async with running_gateway(engine, max_sessions=0) as base:
        err = await _first_error(VoicewireTTS(url=f"http://{base}"))
    assert isinstance(err, APIStatusError) and err.status_code == 503 and err.retryable


async def test_no_warning_or_error_is_logged_through_a_stream(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    async with running_gateway(engine) as base:
        voice = VoicewireTTS(url=f"http://{base}")
        voice.prewarm()
        async with voice.stream() as stream:
            events = await _speak(stream, REPLY)
        await voice.aclose()
    assert events and events[-1].is_final
    assert not caplog.records, [r.getMessage() for r in caplog.records]


async def test_frames_carry_the_words_as_timed_strings_before_their_audio(engine: Engine) -> None:
    async with running_gateway(engine) as base:
        voice = VoicewireTTS(url=f"http://{base}")
        assert voice.capabilities.aligned_transcript
        async with voice.stream() as stream:
            events = await _speak(stream, REPLY)
        await voice.aclose()
    timed: list[tuple[float, TimedString]] = []  # (where the frame carrying it starts, s; the string)
    at_s = 0.0
    for ev in events:
        timed += [(at_s, t) for t in ev.frame.userdata.get(USERDATA_TIMED_TRANSCRIPT, [])]
        at_s += ev.frame.duration
    strings = [t for _, t in timed]
    # Joined, the strings are the text sent; each is one word (with the space before it) and its times.
    assert "".join(strings) == REPLY
    assert [s.strip() for s in strings] == REPLY.split(" ")
    spans = [(s.start_time, s.end_time) for s in strings]
    assert all(isinstance(a, float) and isinstance(b, float) and a < b for a, b in spans), spans
    starts = [float(a) for a, _ in spans]  # type: ignore[arg-type]
    assert starts == sorted(starts) and float(spans[-1][1]) <= at_s + 0.05  # type: ignore[arg-type]
    # Never late: a word rides a frame that starts no later than the word does.
    assert all(frame_s <= start + 0.02 for (frame_s, _), start in zip(timed, starts, strict=True)), timed
