"""The engine end to end with the real embedded voice."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

import numpy as np
import pytest

from tests.conftest import wait_engine_idle
from voicewire.engine import Engine, EngineBusy, EngineConfig, StreamError, StreamParams
from voicewire.engine.level import first_audible_sample
from voicewire.engine.model import Decoded, DecodeWork, GenerateResult, Queued
from voicewire.engine.models.hibari_voice import HibariModel


async def _collect(stream) -> list:  # type: ignore[no-untyped-def]
    return [c async for c in stream]


async def test_concurrent_streams_have_contiguous_offsets_and_a_final_marker(engine: Engine) -> None:
    texts = ["Good morning, everyone.", "The weather is nice today.", "Let us begin the meeting now."]
    streams = []
    for t in texts:
        s = engine.open_stream(seed=1)
        s.push_text(t)
        s.end()
        streams.append(s)
    results = await asyncio.gather(*(_collect(s) for s in streams))
    for chunks in results:
        assert chunks[-1].final
        offset = 0
        for c in chunks:
            assert c.sample_offset == offset and c.sample_rate_hz == 24_000
            offset += c.pcm.size
        assert offset > 24_000 * 0.8  # each sentence is about a second or more
    await wait_engine_idle(engine)


async def test_lead_in_silence_is_trimmed(engine: Engine) -> None:
    s = engine.open_stream(seed=0)
    s.push_text("Hello there.")
    s.end()
    chunks = await _collect(s)
    pcm = np.concatenate([c.pcm for c in chunks])
    onset = first_audible_sample(pcm, 24_000, -45.0)
    assert onset is not None and onset <= 240 * 2  # within 20 ms of the start
    assert s.metrics.trimmed_samples > 24_000 * 0.1  # hibari puts 200-300 ms of near-silence there


async def test_cancel_frees_the_stream_and_drops_queued_audio(engine: Engine) -> None:
    s = engine.open_stream()
    s.push_text("This is a long turn that will be interrupted, " * 5)
    first = await s.__aiter__().__anext__()
    assert first.pcm.size
    s.cancel()
    assert [c async for c in s] == []
    await wait_engine_idle(engine)
    model = engine.model
    assert isinstance(model, HibariModel) and model.open_slots == 0


async def test_text_after_end_and_bad_params_are_refused(engine: Engine) -> None:
    s = engine.open_stream()
    s.push_text("Done.")
    s.end()
    with pytest.raises(StreamError):
        s.push_text("more")
    await _collect(s)
    with pytest.raises(ValueError):
        engine.open_stream(voice="fenrir")  # would download: not offered
    with pytest.raises(ValueError):
        engine.open_stream(speed=9.0)


class _FaultyModel(HibariModel):
    """Fault injection: slots opened with extra={"fail": True} raise inside generate."""

    def __init__(self) -> None:
        super().__init__(max_slots=8)
        self.failing: set[int] = set()

    def open_slot(self, slot: int, params: StreamParams) -> None:
        super().open_slot(slot, params)
        if params.extra.get("fail"):
            self.failing.add(slot)

    def _generate_one(self, slot: int) -> GenerateResult:
        if slot in self.failing:
            raise RuntimeError("injected fault")
        return super()._generate_one(slot)

    def close_slot(self, slot: int) -> None:
        self.failing.discard(slot)
        super().close_slot(slot)


class _DeviceModel(HibariModel):
    """Stage 2 as if on a device queue of its own: decode_start returns at once, its result waits
    WAIT_S (a stand-in for the device) and counts the wait, as Qwen3-TTS counts its syncs."""

    WAIT_S = 0.004
    decode_overlaps = True

    def __init__(self) -> None:
        super().__init__(max_slots=4)
        self.waited_s = 0.0
        self.waits = 0

    def decode_start(self, work: Sequence[DecodeWork], urgent: bool = False) -> Queued[list[Decoded]]:
        out = self.decode_timed(work)

        def finish() -> list[Decoded]:
            t0 = time.perf_counter()
            time.sleep(self.WAIT_S)
            self.waited_s += time.perf_counter() - t0
            self.waits += 1
            return out

        return Queued(finish, lambda: False)  # taken when the engine has nothing else to wait for

    def device_wait_s(self) -> float:
        return self.waited_s


async def test_the_engine_reports_the_time_its_model_waited_for_the_device() -> None:
    model = _DeviceModel()
    eng = Engine(EngineConfig(max_streams=2), model=model).start()
    try:
        s = eng.open_stream(seed=0)
        s.push_text("A turn whose chunks wait for a device. It has two sentences, so two chunks at least.")
        s.end()
        await _collect(s)
        await wait_engine_idle(eng)
    finally:
        eng.close()
    st = eng.stats
    assert model.waits >= 2 and st.device_wait_s == model.waited_s
    assert st.device_wait_s >= model.waits * _DeviceModel.WAIT_S
    # the waits are inside the step's time: the rest is the worker's own (host) time
    assert st.generate_s + st.decode_s - st.device_wait_s > 0.0


class _QueuedStepModel(_DeviceModel):
    """The frame step as if queued on a device (generate_start returns before its results), and a
    switch that holds the next generate_start until the test has sent its commands: they are then
    taken while that step is in flight."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight: set[int] = set()
        self.closed_in_flight: list[int] = []
        self.hold: threading.Event | None = None
        self.held = threading.Event()

    def generate_start(self, slots: Sequence[int]) -> Queued[list[GenerateResult]]:
        self.in_flight = set(slots)
        if self.hold is not None:
            hold, self.hold = self.hold, None
            self.held.set()
            hold.wait(5.0)

        def finish() -> list[GenerateResult]:
            out = self.generate(slots)
            self.in_flight = set()
            return out

        return Queued(finish)

    def close_slot(self, slot: int) -> None:
        if slot in self.in_flight:
            self.closed_in_flight.append(slot)
        super().close_slot(slot)


async def test_a_stream_ended_during_a_queued_step_frees_its_slot_after_the_step() -> None:
    model = _QueuedStepModel()
    eng = Engine(EngineConfig(max_streams=2, max_queued_streams=2), model=model).start()
    try:
        a, b = eng.open_stream(seed=0), eng.open_stream(seed=1)
        for s in (a, b):
            s.push_text("Two turns share every step until the first one is cancelled. " * 3)
        await a.__aiter__().__anext__()
        release = model.hold = threading.Event()
        assert await asyncio.get_running_loop().run_in_executor(None, model.held.wait, 5.0)
        stepping = set(model.in_flight)
        a.cancel()  # both commands reach the worker while the step of a's slot is in flight
        c = eng.open_stream(seed=2)  # no slot is free until that step's results are in
        c.push_text("This one waits for the slot a gives back.")
        c.end()
        release.set()
        b.end()
        chunks = await asyncio.wait_for(_collect(c), 20)
        assert chunks[-1].final and sum(x.pcm.size for x in chunks) > 0
        rest = await _collect(b)
        assert rest[-1].final and sum(x.pcm.size for x in rest) > 0
        await wait_engine_idle(eng)
    finally:
        eng.close()
    assert len(stepping) == 2  # a's and b's slots were in that step
    assert model.closed_in_flight == []
    assert model.open_slots == 0 and eng.active_streams() == 0


async def test_a_failing_stream_ends_with_an_error_and_others_complete() -> None:
    eng = Engine(EngineConfig(max_streams=4, max_queued_streams=0), model=_FaultyModel()).start()
    try:
        good = eng.open_stream(seed=0)
        bad = eng.open_stream(StreamParams(extra={"fail": True}))
        for s in (good, bad):
            s.push_text("Both of these turns start at the same time.")
            s.end()
        with pytest.raises(StreamError) as err:
            await _collect(bad)
        assert err.value.code == "model_error"
        chunks = await _collect(good)
        assert chunks[-1].final and sum(c.pcm.size for c in chunks) > 24_000
        # the engine keeps working after the fault
        again = eng.open_stream()
        again.push_text("Still here.")
        again.end()
        assert sum(c.pcm.size for c in await _collect(again)) > 0
        # and refuses streams beyond its limit
        held = [eng.open_stream() for _ in range(4)]
        with pytest.raises(EngineBusy):
            eng.open_stream()
        for h in held:
            h.cancel()
        await wait_engine_idle(eng)
    finally:
        eng.close()


async def test_opens_past_the_limit_wait_in_order_and_time_out_with_server_busy() -> None:
    eng = Engine(EngineConfig(max_streams=1, max_queued_streams=2, queue_wait_s=0.6)).start()
    try:
        held = eng.open_stream(seed=0)  # runs, and holds the only stream until it is ended
        held.push_text("Held open.")
        waiting = eng.open_stream(seed=1)  # text while waiting is kept and spoken once it runs
        waiting.push_text("Spoken after the wait.")
        late = eng.open_stream(seed=2)
        t0 = asyncio.get_running_loop().time()
        with pytest.raises(EngineBusy, match="2 waiting"):
            eng.open_stream()  # one running + two waiting: the queue is full
        await asyncio.sleep(0.2)
        held.end()  # frees the stream once its audio is made: the oldest waiting open gets it
        assert sum(c.pcm.size for c in await _collect(held)) > 0
        with pytest.raises(StreamError) as err:
            await _collect(late)  # its wait runs out while `waiting` holds the stream
        assert err.value.code == "server_busy"
        assert asyncio.get_running_loop().time() - t0 >= 0.6 - 0.05
        waiting.end()
        chunks = await _collect(waiting)
        assert chunks[-1].final and sum(c.pcm.size for c in chunks) > 0
        queued_then_cancelled = [eng.open_stream(), eng.open_stream()]
        for s in queued_then_cancelled:
            s.cancel()
        await wait_engine_idle(eng)
        assert eng.active_streams() == 0
        assert (eng.stats.streams_queued, eng.stats.queue_timeouts) == (3, 1)
    finally:
        eng.close()


async def test_a_caller_that_stops_reading_stops_generation() -> None:
    eng = Engine(EngineConfig(max_ahead_s=2.0)).start()
    try:
        s = eng.open_stream(seed=0)
        s.push_text("This sentence is spoken again and again to make a very long turn. " * 20)
        s.end()
        await asyncio.sleep(1.5)  # nobody reads: the engine must stop about 2 s of audio ahead
        ahead_s = eng._live[s.id].request.samples_emitted / 24_000
        assert 2.0 <= ahead_s < 2.0 + 6.0, ahead_s  # one clause (a few seconds) may overshoot
        chunks = await _collect(s)  # reading resumes generation up to the end
        total_s = sum(c.pcm.size for c in chunks) / 24_000
        assert chunks[-1].final and total_s > 60
    finally:
        eng.close()
