"""The engine in its own process (``CoreClient`` + the core process) against the in-process engine.

Real processes and real ZeroMQ sockets; the embedded voice. One core serves the module (each start
costs ~1.5 s on 2 cores); tests that kill a core start their own.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator

import numpy as np
import pytest
import pytest_asyncio

from voicewire.engine import (
    AudioChunk,
    Engine,
    EngineBusy,
    EngineConfig,
    EngineNotReady,
    EngineStats,
    ModelInfo,
    Stream,
    StreamError,
    StreamParams,
    TextGranularity,
    WordTiming,
)
from voicewire.engine.commands import Cancel, PushText
from voicewire.engine.core import CoreClient, CoreState
from voicewire.engine.core.messages import (
    Audio,
    CloneVoice,
    Closed,
    Failed,
    OpenStream,
    Ready,
    Stats,
    decode_all_from_core,
    decode_all_to_core,
    decode_from_core,
    decode_to_core,
    encode_from_core,
    encode_to_core,
)
from voicewire.engine.core.outgoing import Outgoing

module_loop = pytest.mark.asyncio(loop_scope="module")  # the loop the module's core lives on

# A small limit and a short lead, so the limits are reached in a test's time.
CONFIG = EngineConfig(max_streams=2, max_queued_streams=1, queue_wait_s=5.0, max_ahead_s=1.0)
SHORT = "Hello there, this is the engine speaking from its own process."
LONG = "This sentence keeps going so that the stream has much more audio than the bound allows. " * 6
RATE_HZ = 24_000


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def core() -> AsyncIterator[CoreClient]:
    async with CoreClient(CONFIG) as client:
        yield client


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def local() -> AsyncIterator[Engine]:
    async with Engine(CONFIG) as engine:
        yield engine


async def _speak(engine: Engine | CoreClient, text: str, seed: int) -> tuple[np.ndarray, list[AudioChunk]]:
    stream = engine.open_stream(seed=seed)
    stream.push_text(text)
    stream.end()
    chunks = [c async for c in stream]
    return np.concatenate([c.pcm for c in chunks]), chunks


async def _until(cond: object, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond() and time.monotonic() < deadline:  # type: ignore[operator]
        await asyncio.sleep(0.01)
    assert cond(), f"not true within {timeout_s} s"  # type: ignore[operator]


@module_loop
async def test_a_turn_round_trips_with_the_in_process_engines_pcm(core: CoreClient, local: Engine) -> None:
    assert core.ready and core.info == local.info and core.max_streams == 2
    idle = core.open_stream()
    assert isinstance(idle, Stream)  # the engine's own type, as Session and Turn expect
    idle.cancel()
    remote, remote_chunks = await _speak(core, SHORT, seed=7)
    here, here_chunks = await _speak(local, SHORT, seed=7)
    assert remote.size > RATE_HZ  # over a second of speech
    assert remote.dtype == np.float32 and np.array_equal(remote, here)  # bit-identical
    assert [(c.sample_offset, c.final, c.text, c.words) for c in remote_chunks] == [
        (c.sample_offset, c.final, c.text, c.words) for c in here_chunks
    ]
    assert sum(len(c.words) for c in remote_chunks) == len(SHORT.split())  # word timings crossed too
    await _until(lambda: core.active_streams() == 0, 1.0)


@module_loop
async def test_backpressure_stops_the_core_where_the_in_process_engine_stops(
    core: CoreClient, local: Engine
) -> None:
    async def hold_then_read(engine: Engine | CoreClient) -> tuple[int, int]:
        stream = engine.open_stream(seed=3)
        stream.push_text(LONG)
        stream.end()
        await asyncio.sleep(2.0)  # nobody reads: generation must stop near max_ahead_s
        held = stream.metrics.audio_samples
        total = sum([c.pcm.size async for c in stream])
        return held, total

    (remote_held, remote_total), (here_held, here_total) = await asyncio.gather(
        hold_then_read(core), hold_then_read(local)
    )
    assert remote_total == here_total > 10 * RATE_HZ
    # The core stopped where the in-process engine stops: the bound is the remote caller's reading.
    assert remote_held == here_held < remote_total / 4, (remote_held, here_held, remote_total)


@module_loop
async def test_an_open_past_the_limit_waits_and_one_past_the_queue_is_refused_at_once(core: CoreClient) -> None:
    first, second = core.open_stream(), core.open_stream()
    third = core.open_stream(seed=1)  # waits in the core's queue, its text kept
    third.push_text("Still here.")
    third.end()
    with pytest.raises(EngineBusy):
        core.open_stream()
    first.cancel()  # frees a stream: the waiting open runs
    assert sum([c.pcm.size async for c in third]) > 0
    second.cancel()
    # A stream counts as free once the core says the cancelled one is gone.
    await _until(lambda: core.active_streams() == 0, 1.0)
    await _until(lambda: core.active_streams() == 0, 1.0)
    with pytest.raises(ValueError, match="unknown voice"):
        core.open_stream(voice="nobody")


@module_loop
async def test_a_killed_core_ends_its_streams_with_model_error_and_starts_again() -> None:
    client = CoreClient(CONFIG, name="victim")
    with pytest.raises(EngineNotReady):
        client.open_stream()
    await client.start()
    try:
        stream = client.open_stream(seed=2)
        stream.push_text(LONG)
        stream.end()
        it = aiter(stream)
        assert (await anext(it)).pcm.size > 0
        assert client.pid is not None
        os.kill(client.pid, signal.SIGKILL)
        with pytest.raises(StreamError) as err:
            async for _ in it:
                pass
        assert err.value.code == "model_error"
        assert client.state is CoreState.DOWN and client.last_exit == "signal 9"
        with pytest.raises(EngineNotReady):
            client.open_stream()
        await client.start()  # the same sockets, a fresh process
        assert client.restarts == 1
        pcm, _ = await _speak(client, "Back again.", seed=1)
        assert pcm.size > 0
    finally:
        await client.close()
    assert client.state is CoreState.STOPPED


def test_the_wire_format_keeps_every_field_and_the_pcm_bytes() -> None:
    pcm = np.linspace(-1, 1, 1920, dtype=np.float32)
    words = (WordTiming("a", 0, 700), WordTiming("clause", 900, 2500))  # an end may lie past the chunk
    chunk = AudioChunk(pcm, RATE_HZ, 4800, final=True, text="a clause", stop_reason="length", words=words)
    audio = decode_from_core(encode_from_core(Audio(5, chunk, 120)))
    assert audio.chunk.words == words  # type: ignore[union-attr]
    assert isinstance(audio, Audio) and audio.stream_id == 5 and audio.trimmed_samples == 120
    assert np.array_equal(audio.chunk.pcm, pcm) and audio.chunk.final and audio.chunk.text == "a clause"
    assert audio.chunk.stop_reason == "length"  # a guarded stream's turn.done says so across processes
    frames = encode_from_core(Audio(5, chunk, 120))
    assert len(frames) == 2 and frames[1] == pcm.tobytes()  # raw PCM, its own frame
    info = ModelInfo("m", RATE_HZ, 300, TextGranularity.CLAUSE, 2, 8, ("a", "b"))
    assert decode_from_core(encode_from_core(Ready(info, 8, 123))) == Ready(info, 8, 123)
    stats = EngineStats(steps=3, generate_s=0.5)
    stats.batch_sizes[2] += 4
    got = decode_from_core(encode_from_core(Stats(stats, 1)))
    assert isinstance(got, Stats) and got.stats == stats and got.active_streams == 1
    params = StreamParams(voice="a", speed=1.5, seed=9, extra={"k": 1})
    assert decode_to_core(encode_to_core(OpenStream(1, params))) == OpenStream(1, params)
    assert decode_to_core(encode_to_core(PushText(1, "héllo"))) == PushText(1, "héllo")
    assert decode_to_core(encode_to_core(Cancel(1))) == Cancel(1)
    with pytest.raises(ValueError, match="cannot receive"):
        encode_to_core(OpenStream(1, StreamParams(extra={"profile": object()})))



async def test_one_loop_pass_goes_as_one_batch_a_destination_and_decodes_in_order() -> None:
    sent: list[list[bytes]] = []
    out = Outgoing(sent.append)
    chunk = AudioChunk(np.ones(960, np.float32), RATE_HZ, 0, text="hi")
    batch = [Audio(1, chunk, 0), Closed(2), Failed(3, "model_error", "x"), Audio(4, chunk, 7)]
    for msg in batch:
        out.put(encode_from_core(msg), b"\x40\0\0\1")
    out.put(encode_from_core(Closed(9)))  # another peer: a batch of its own, no routing id
    assert sent == []  # nothing before the pass ends
    await asyncio.sleep(0)
    assert [frames[0] for frames in sent] == [b"\x40\0\0\1", encode_from_core(Closed(9))[0]]
    got = decode_all_from_core(sent[0][1:])
    assert [type(m) for m in got] == [Audio, Closed, Failed, Audio]
    assert got[1:3] == batch[1:3] and isinstance(got[3], Audio) and got[3].trimmed_samples == 7
    assert all(np.array_equal(m.chunk.pcm, chunk.pcm) for m in got if isinstance(m, Audio))
    out.put(encode_from_core(Closed(5)))
    out.flush()  # at once, before a socket closes
    assert decode_all_from_core(sent[2]) == [Closed(5)]
    commands = [PushText(1, "a"), CloneVoice(2, np.zeros(4, np.float32), RATE_HZ, "ref"), Cancel(1)]
    frames = [f for cmd in commands for f in encode_to_core(cmd)]
    first, clone, last = decode_all_to_core(frames)
    assert (first, last) == (commands[0], commands[2])
    assert isinstance(clone, CloneVoice) and clone.ref_text == "ref" and clone.pcm.size == 4
