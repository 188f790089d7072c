"""The LiveKit Agents adapter: a real SynthesizeStream against a real gateway and engine."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import numpy as np
import pytest
from livekit import rtc
from livekit.agents import APIConnectionError, APIError, APIStatusError, APITimeoutError, tts
from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT, APIConnectOptions, TimedString
from livekit.agents.voice import io
from livekit.agents.voice.transcription.synchronizer import TranscriptSynchronizer

from tests.asr import transcribe, wer
from tests.conftest import free_port, running_gateway
from tests.realtime.gateway import gateway
from voicewire.engine import Engine
from voicewire.realtime.auth import AuthConfig
from voicewire.realtime.client.adapters.livekit import VoicewireTTS

REPLY = "The package left our warehouse yesterday and should arrive soon."
SENTENCE = (  # one sentence of short clauses: an LLM at 20 words/s stays ahead of speech
    "Thanks for calling today, my name is Avery, and I will be glad to help you, step by step, "
    "with moving your account to the new plan, before the end of the month, without any extra cost."
)
# A pause between two words' starts (a clause's last word, the silence after it) to barge in
# during, and how long before the next word the barge-in comes.
MIN_PAUSE_S = 0.6
BARGE_BEFORE_S = 0.1
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


NO_RETRY = APIConnectOptions(max_retry=0, timeout=1.0)


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

    # A server that accepts the connection and never answers: a timeout, after the stream's own.
    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # until the client gives up and closes
        writer.close()

    silent = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    port = silent.sockets[0].getsockname()[1]
    t0 = time.perf_counter()
    err = await _first_error(VoicewireTTS(url=f"http://127.0.0.1:{port}"))
    waited_s = time.perf_counter() - t0
    silent.close()
    await silent.wait_closed()
    assert isinstance(err, APITimeoutError) and err.retryable and waited_s < NO_RETRY.timeout + 1
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


class Speaker(io.AudioOutput):
    """LiveKit's end of the audio chain as a device that plays in real time: frames queue up as they
    come and play one after another on the device's clock, with the playback events a room output
    sends. Each frame is due when the one before it ends (or, after an underrun, when it comes), so
    a late wake-up of this task, as under CPU load, does not slow the clock down: the position is
    the wall time played, as a sound card's would be."""

    def __init__(self) -> None:
        super().__init__(label="speaker", capabilities=io.AudioOutputCapabilities(pause=False))
        self._frames: asyncio.Queue[rtc.AudioFrame | None] = asyncio.Queue()
        self.started = asyncio.Event()
        self._played_s = 0.0  # the frames played to their end
        self._frame: tuple[float, float] | None = None  # the frame playing now: (time.monotonic() it began, s)
        self._player = asyncio.ensure_future(self._play())

    @property
    def position_s(self) -> float:
        if self._frame is None:
            return self._played_s
        began, duration_s = self._frame
        return self._played_s + min(max(0.0, time.monotonic() - began), duration_s)

    async def reach(self, position_s: float) -> None:
        """Returns once playback is at ``position_s``."""
        while (left_s := position_s - self.position_s) > 0:
            await asyncio.sleep(left_s)

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        await super().capture_frame(frame)
        self._frames.put_nowait(frame)

    def flush(self) -> None:
        super().flush()
        self._frames.put_nowait(None)

    def clear_buffer(self) -> None:
        position_s = self.position_s
        self._player.cancel()
        self.on_playback_finished(playback_position=position_s, interrupted=True)

    async def _play(self) -> None:
        due = 0.0  # time.monotonic() the next frame starts playing
        while (frame := await self._frames.get()) is not None:
            if not self.started.is_set():
                self.started.set()
                self.on_playback_started(created_at=time.time())
            due = max(due, time.monotonic())  # an underrun: the device plays the frame when it comes
            self._frame = (due, frame.duration)
            due += frame.duration
            await asyncio.sleep(due - time.monotonic())
            self._played_s += frame.duration
            self._frame = None
        self.on_playback_finished(playback_position=self._played_s, interrupted=False)


class Transcript(io.TextOutput):
    def __init__(self) -> None:
        super().__init__(label="transcript", next_in_chain=None)
        self.text = ""

    async def capture_text(self, text: str) -> None:
        self.text += text

    def flush(self) -> None:
        pass


async def test_livekit_keeps_the_words_played_when_the_user_barges_in(engine: Engine) -> None:
    # What an agent does with the stream: its frames to the audio output and their timed strings
    # to the text output, both through LiveKit's TranscriptSynchronizer, whose transcript at the
    # cut is what the agent keeps in its chat context.
    speaker = Speaker()
    sync = TranscriptSynchronizer(next_in_chain_audio=speaker, next_in_chain_text=Transcript())
    finished: asyncio.Future[io.PlaybackFinishedEvent] = asyncio.get_running_loop().create_future()

    def on_finished(ev: io.PlaybackFinishedEvent) -> None:
        if not finished.done():
            finished.set_result(ev)

    sync.audio_output.on("playback_finished", on_finished)
    # The user barges in during a pause, BARGE_BEFORE_S before the next word begins. The
    # synchronizer shows each word some time after it begins (up to a word's length, by its own
    # pace); cut at a moment chosen on the wall clock and, as often as not, the word before the
    # last one begun is still to come out of it, the more so the later its timers fire (CPU load).
    # After a pause only the last word begun can be pending.
    pause: asyncio.Future[tuple[float, float]] = asyncio.get_running_loop().create_future()
    async with running_gateway(engine) as base:
        voice = VoicewireTTS(url=f"http://{base}")
        stream = voice.stream()

        async def llm() -> None:  # faster than speech, still writing its reply at the cut
            for word in SENTENCE.split(" "):
                stream.push_text(word + " ")
                await asyncio.sleep(1 / 20)
            await asyncio.Event().wait()  # the reply goes on: the turn stays open

        async def forward() -> None:
            last_start_s = 0.0
            async for ev in stream:
                for timed in ev.frame.userdata.get(USERDATA_TIMED_TRANSCRIPT, []):
                    start_s = float(timed.start_time)
                    if start_s - last_start_s >= MIN_PAUSE_S and start_s > 1.0 and not pause.done():
                        pause.set_result((last_start_s, start_s))
                    last_start_s = start_s
                    await sync.text_output.capture_text(timed)
                await sync.audio_output.capture_frame(ev.frame)

        tasks = [asyncio.create_task(llm()), asyncio.create_task(forward())]
        await asyncio.wait_for(speaker.started.wait(), 10.0)
        word_s, next_word_s = await asyncio.wait_for(pause, 10.0)
        await asyncio.wait_for(speaker.reach(next_word_s - BARGE_BEFORE_S), 10.0)
        # The user barged in: the agent stops its reply and clears the audio output.
        for task in tasks:
            task.cancel()
        await stream.aclose()
        sync.audio_output.clear_buffer()
        cut = await asyncio.wait_for(finished, 5.0)
        assert stream.turn is not None
        done = await stream.turn.done(timeout_s=2.0)
        words = stream.turn.words()
        await voice.aclose()
    await sync.aclose()

    kept = cut.synchronized_transcript or ""
    # The words that had begun playing at the cut, by the server's timings (checked against real
    # word onsets in the engine's tests).
    begun = [w for w in words if w.start_ms < cut.playback_position * 1000]
    print(
        f"cut at {cut.playback_position:.2f} s: kept {kept!r}; begun {len(begun)}; server {done.text_spoken!r}"
    )
    assert word_s + MIN_PAUSE_S - BARGE_BEFORE_S <= cut.playback_position < next_word_s  # in the pause
    assert SENTENCE.startswith(kept.strip())
    assert abs(len(kept.split()) - len(begun)) <= 1
    assert done.reason == "cancelled" and abs(done.played_ms - cut.playback_position * 1000) < 100, (
        done.played_ms
    )


def _words(text: str) -> list[str]:
    return [w.strip(".,?!").lower() for w in text.split()]


async def test_an_interruption_after_the_reply_was_all_sent_reports_what_played(engine: Engine) -> None:
    """The server sends the reply faster than it plays: its turn.done comes while the agent still
    plays it, frame by frame. Closing the stream then tells the server where the listener was, and
    the turn's account holds the words of that audio."""
    async with running_gateway(engine) as base:
        voice = VoicewireTTS(url=f"http://{base}")
        stream = voice.stream()
        stream.push_text(LONG_REPLY)
        stream.end_input()
        taken: list[tts.SynthesizedAudio] = []

        async def play() -> None:  # an audio output that takes each frame as the last one played
            async for ev in stream:
                taken.append(ev)
                await asyncio.sleep(ev.frame.duration)

        player = asyncio.create_task(play())
        while not taken:
            await asyncio.sleep(0.005)
        t_first = time.perf_counter()
        assert stream.turn is not None
        sent = await stream.turn.done(timeout_s=10.0)
        await asyncio.sleep(1.0 - (time.perf_counter() - t_first))
        heard_s = time.perf_counter() - t_first
        player.cancel()
        await stream.aclose()  # what LiveKit does when the agent is interrupted
        done = await stream.turn.played(timeout_s=5.0)
        await voice.aclose()

    assert sent.reason == "completed" and sent.played_source == "sent"
    assert done.reason == "completed" and done.played_source == "client"
    assert abs(done.played_ms - heard_s * 1000) < 150, (done.played_ms, heard_s)
    heard = transcribe(_pcm(taken)[: round(done.played_ms * 24)], 24_000)
    assert LONG_REPLY.startswith(done.text_spoken) and done.text_spoken
    assert abs(len(_words(heard)) - len(_words(done.text_spoken))) <= 1, (heard, done.text_spoken)


async def test_text_after_an_interruption_opens_no_turn(engine: Engine) -> None:
    """One stream is one turn: LLM text pushed after LiveKit closed the stream opens none."""
    async with gateway(engine) as gw:
        voice = VoicewireTTS(url=gw.url)
        stream = voice.stream()
        stream.push_text("Let me check that for you, ")
        stream.flush()
        assert await _next(stream, 10.0) is not None
        await stream.aclose()  # the interruption
        for word in LONG_REPLY.split(" ")[:12]:  # the LLM's text still coming
            with contextlib.suppress(RuntimeError):
                stream.push_text(" " + word)
        await asyncio.sleep(1.0)
        left = sum(s.open_turns for s in gw.sessions)
        async with voice.stream() as nxt:
            events = await _speak(nxt, REPLY)
        after = sum(s.open_turns for s in gw.sessions)
        await voice.aclose()
    assert (left, after) == (0, 0)
    assert wer(REPLY, transcribe(_pcm(events), 24_000)) <= 0.15
