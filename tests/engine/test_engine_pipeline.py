"""The engine's pipeline (engine.py's docstring) around a model shaped like Qwen3-TTS on CUDA: two frame
steps in flight, codec work that finishes a while after it is begun. Every frame's audio is its own
number, so a listener can tell a lost, doubled or reordered frame."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

import numpy as np
import pytest

from tests.conftest import wait_engine_idle
from voicewire.engine import AudioChunk, Engine, EngineConfig, LevelConfig, Stream, StreamParams
from voicewire.engine.model import (
    Decoded,
    DecodeWork,
    GenerateResult,
    Model,
    ModelInfo,
    Queued,
    TextGranularity,
)
from voicewire.engine.slots import SlotPool

FRAME = 1920
STEP_S = 0.002  # a frame step's device time
CODEC_S = 0.003  # a piece of codec work's


class _DeviceTimeline:
    """One in-order device queue: work begun now finishes ``seconds`` after the work before it."""

    def __init__(self) -> None:
        self.free_at = 0.0

    def begin(self, seconds: float) -> float:
        self.free_at = max(time.perf_counter(), self.free_at) + seconds
        return self.free_at


class _PipelinedModel(Model):
    """``forced_frames`` is a length ``ready`` knows; ``extra["stops_after"]`` one that shows only when
    the frame that ends it is recorded (a stop token), so a step begun behind that one steps the
    stream once more, and that frame must be dropped."""

    steps_in_flight = 2
    decode_overlaps = True
    step_s = STEP_S

    def __init__(self) -> None:
        self.info = ModelInfo("pipelined", 24_000, FRAME, TextGranularity.WORD, 8, 8, ("v",), random_weights=True)
        self.main, self.codec = _DeviceTimeline(), _DeviceTimeline()
        self.forced: dict[int, int | None] = {}
        self.stops_after: dict[int, int | None] = {}
        self.made: dict[int, int] = {}  # frames recorded
        self.begun: dict[int, int] = {}  # frames of begun steps not recorded yet
        self.done: dict[int, bool] = {}
        self.steps_begun = 0  # begun steps whose results are not taken
        self.most_steps_begun = 0
        self.closed_while_begun: list[int] = []
        self.wasted_rows = 0

    def open_slot(self, slot: int, params: StreamParams) -> None:
        assert slot not in self.made, f"slot {slot} opened twice"
        stop = params.extra.get("stops_after")
        self.forced[slot], self.stops_after[slot] = params.forced_frames, int(stop) if stop else None
        self.made[slot], self.begun[slot], self.done[slot] = 0, 0, False

    def add_text(self, slot: int, pieces: Sequence[str], final: bool) -> None:
        pass

    def ready(self, slot: int) -> bool:
        forced = self.forced.get(slot)
        return not self.done.get(slot, True) and (forced is None or self.made[slot] + self.begun[slot] < forced)

    def generate(self, slots: Sequence[int]) -> list[GenerateResult]:
        return self.generate_start(slots)()

    def generate_start(self, slots: Sequence[int]) -> Queued[list[GenerateResult]]:
        assert all(self.ready(s) for s in slots)
        for s in slots:
            self.begun[s] += 1
        self.steps_begun += 1
        self.most_steps_begun = max(self.most_steps_begun, self.steps_begun)
        assert self.steps_begun <= self.steps_in_flight
        ends_at = self.main.begin(self.step_s)

        def finish() -> list[GenerateResult]:
            time.sleep(max(0.0, ends_at - time.perf_counter()))
            self.steps_begun -= 1
            return [self._record(s) for s in slots]

        return Queued(finish, lambda: time.perf_counter() >= ends_at)

    def _record(self, slot: int) -> GenerateResult:
        self.begun[slot] -= 1
        if self.done[slot]:
            self.wasted_rows += 1
            return GenerateResult(slot, None, 0, True)
        self.made[slot] += 1
        n = self.made[slot]
        self.done[slot] = n in (self.forced[slot], self.stops_after[slot])
        return GenerateResult(slot, np.array([n]), 1, self.done[slot])

    def decode(self, work: Sequence[DecodeWork]) -> list[np.ndarray]:
        return [np.repeat(np.concatenate(w.frames).astype(np.float32), FRAME) / 1000 for w in work]

    def decode_start(self, work: Sequence[DecodeWork], urgent: bool = False) -> Queued[list[Decoded]]:
        out = self.decode_timed(work)
        ends_at = self.codec.begin(CODEC_S)

        def wait() -> list[Decoded]:
            time.sleep(max(0.0, ends_at - time.perf_counter()))
            return out

        return Queued(wait, lambda: time.perf_counter() >= ends_at)

    def close_slot(self, slot: int) -> None:
        if self.begun.get(slot):
            self.closed_while_begun.append(slot)
        for d in (self.forced, self.stops_after, self.made, self.begun, self.done):
            d.pop(slot, None)


async def _collect(stream: Stream) -> list[AudioChunk]:
    return [c async for c in stream]


@pytest.mark.parametrize(("min_rows", "quiet", "in_flight"), [(0, 0, 2), (9, 0, 1), (9, 16, 2)])
async def test_frames_of_pipelined_steps_reach_each_stream_once_and_in_order(
    min_rows: int, quiet: int, in_flight: int
) -> None:
    """Two steps in flight where each has at least ``queue_ahead_min_rows`` rows (here: any), one
    where none can (more rows than streams), and two again where only a new stream's first frame
    is queued behind a quiet step (``quiet_rows``): the same audio every way."""
    model = _PipelinedModel()
    flat = LevelConfig(onset_threshold_dbfs=-300.0, max_trim_ms=0.0)
    config = EngineConfig(
        max_streams=8, max_queued_streams=8, level=flat, queue_ahead_min_rows=min_rows, quiet_rows=quiet
    )
    eng = Engine(config, model=model).start()
    lengths = [(17, None), (None, 9), (30, None), (None, 23), (5, None), (None, 1), (12, None), (None, 40)]
    try:
        streams = []
        for i, (forced, stop) in enumerate(lengths):
            s = eng.open_stream(StreamParams(forced_frames=forced, extra={"stops_after": stop} if stop else {}))
            s.push_text(f"turn {i}.")
            s.end()
            streams.append(s)
            await asyncio.sleep(0.003 * (i % 3))  # they join steps already in flight
        cut = eng.open_stream(StreamParams(forced_frames=200))
        cut.push_text("cancelled while its steps are in flight.")
        got = await asyncio.wait_for(asyncio.gather(*(_collect(s) for s in streams)), 20)
        first = await cut.__aiter__().__anext__()
        cut.cancel()
        await wait_engine_idle(eng)
    finally:
        eng.close()
    for (forced, stop), chunks in zip(lengths, got, strict=True):
        n = forced or stop
        pcm = np.concatenate([c.pcm for c in chunks])
        np.testing.assert_array_equal(pcm, np.repeat(np.arange(1, n + 1, dtype=np.float32), FRAME) / 1000)
        assert chunks[-1].final
    assert first.pcm.size and model.made == {}  # the cancelled stream's slot was closed too
    assert model.most_steps_begun == in_flight and model.closed_while_begun == []
    # with every step queued behind, a stop seen late stepped its stream once more, and that was dropped
    assert (model.wasted_rows >= 1) == (min_rows == 0) or quiet > 0
    assert eng.active_streams() == 0


def test_the_slot_free_longest_is_taken_first() -> None:
    """A slot just given back (its last codec call may still run) goes to a new stream only after
    every slot that was free before it."""
    pool = SlotPool(3)
    a, b = pool.take(), pool.take()
    pool.put(a)
    assert pool.take() == 2  # never used, free since the start
    pool.put(b)
    assert [pool.take(), pool.take()] == [a, b]
    assert not pool


def test_a_released_slot_comes_back_after_every_begun_step_that_has_it() -> None:
    pool = SlotPool(4)
    a, b = pool.take(), pool.take()
    pool.step_started([a, b])
    pool.step_started([a])
    assert not pool.release(a) and not pool.release(b)
    assert pool.step_done() == [b]  # a is still in the step begun behind
    assert pool.step_done() == [a]
    assert pool.release(a)  # no step has it any more: the caller frees it at once


class _TwoLaneModel(_PipelinedModel):
    """_PipelinedModel with an urgent codec lane (Model.urgent_decode): urgent pieces take CODEC_S on
    a queue of their own, bulk pieces BULK_S each on theirs."""

    BULK_S = 0.25
    urgent_decode = True

    def __init__(self) -> None:
        super().__init__()
        self.urgent_lane = _DeviceTimeline()
        self.pieces: list[tuple[bool, list[int], float]] = []  # (urgent, slots, ends at)

    def decode_start(self, work: Sequence[DecodeWork], urgent: bool = False) -> Queued[list[Decoded]]:
        out = self.decode_timed(work)
        ends_at = (self.urgent_lane if urgent else self.codec).begin(CODEC_S if urgent else self.BULK_S)
        self.pieces.append((urgent, [w.slot for w in work], ends_at))

        def wait() -> list[Decoded]:
            time.sleep(max(0.0, ends_at - time.perf_counter()))
            return out

        return Queued(wait, lambda: time.perf_counter() >= ends_at)


async def test_a_new_streams_first_chunk_leaves_before_the_bulk_codec_work_begun_before_it() -> None:
    """Urgent chunks (a first chunk has no slack) go on the model's urgent lane and are handed out
    as soon as they are done, past bulk work still running; every stream's audio stays whole and in
    order."""
    model = _TwoLaneModel()
    flat = LevelConfig(onset_threshold_dbfs=-300.0, max_trim_ms=0.0)
    config = EngineConfig(max_streams=8, level=flat, urgent_slack_s=0.2, queue_ahead_min_rows=0)
    eng = Engine(config, model=model).start()
    try:
        ahead = eng.open_stream(StreamParams(forced_frames=60))
        ahead.push_text("a stream far ahead of its listener.")
        ahead.end()
        first = await ahead.__aiter__().__anext__()
        t_bulk = 0.0
        while not t_bulk:  # its chunks once seconds ahead: bulk pieces of BULK_S each
            await asyncio.sleep(0.005)
            t_bulk = next((end for urgent, _, end in model.pieces if not urgent and end > time.perf_counter()), 0.0)
        late = eng.open_stream(StreamParams(forced_frames=3))
        late.push_text("a new turn.")
        late.end()
        late_chunks = await asyncio.wait_for(_collect(late), 5)
        t_late_first = time.perf_counter()
        rest = await asyncio.wait_for(_collect(ahead), 20)
        await wait_engine_idle(eng)
    finally:
        eng.close()
    assert t_late_first < t_bulk  # all of it out while the bulk piece begun before it still ran
    for n, chunks in ((60, [first, *rest]), (3, late_chunks)):
        pcm = np.concatenate([c.pcm for c in chunks])
        np.testing.assert_array_equal(pcm, np.repeat(np.arange(1, n + 1, dtype=np.float32), FRAME) / 1000)
    assert any(urgent for urgent, _, _ in model.pieces) and any(not u for u, _, _ in model.pieces)


class _FirstChunkModel(_TwoLaneModel):
    """_TwoLaneModel that keeps when each frame step starts on the device, and each first chunk's
    urgent piece's span."""

    def __init__(self) -> None:
        super().__init__()
        self.step_starts: list[float] = []
        self.first_chunks: list[tuple[float, float]] = []

    def generate_start(self, slots: Sequence[int]) -> Queued[list[GenerateResult]]:
        self.step_starts.append(max(time.perf_counter(), self.main.free_at))
        return super().generate_start(slots)

    def decode_start(self, work: Sequence[DecodeWork], urgent: bool = False) -> Queued[list[Decoded]]:
        first = urgent and any(w.frames[0][0] == 1 for w in work)  # a slot's frame 1: its first chunk
        start = max(time.perf_counter(), self.urgent_lane.free_at)
        out = super().decode_start(work, urgent)
        if first:
            self.first_chunks.append((start, self.urgent_lane.free_at))
        return out


@pytest.mark.parametrize("alone_rows", [16, 0])
async def test_a_first_chunk_runs_alone_on_a_quiet_device(alone_rows: int) -> None:
    """With a new stream's first chunk on the codec and no frame step in flight, the next step of a
    few streams that have audio in hand (here: that stream's own second frame) waits for the chunk,
    so the two do not share the device; with ``quiet_rows`` 0 it runs beside it. A new
    stream's first frame never waits: it opens while the other streams' first chunks are out."""
    model = _FirstChunkModel()
    flat = LevelConfig(onset_threshold_dbfs=-300.0, max_trim_ms=0.0)
    config = EngineConfig(max_streams=8, level=flat, quiet_rows=alone_rows)
    eng = Engine(config, model=model).start()
    try:
        for i in range(4):
            s = eng.open_stream(StreamParams(forced_frames=8))
            s.push_text("one turn at a time.")
            s.end()
            chunks = await asyncio.wait_for(_collect(s), 5)
            pcm = np.concatenate([c.pcm for c in chunks])
            np.testing.assert_array_equal(pcm, np.repeat(np.arange(1, 9, dtype=np.float32), FRAME) / 1000)
            await asyncio.sleep(0.02 * i)
        await wait_engine_idle(eng)
    finally:
        eng.close()
    assert len(model.first_chunks) == 4
    beside = [t for t in model.step_starts for a, b in model.first_chunks if a <= t < b]
    assert (not beside) if alone_rows else len(beside) >= 3


class _StepLogModel(_PipelinedModel):
    """_PipelinedModel that logs each step's slots and how long the device sat idle before it; its
    steps are long beside the worker's time, so a turn mostly comes while one runs."""

    step_s = 0.02

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[tuple[list[int], float]] = []  # (slots, idle before it)

    def generate_start(self, slots: Sequence[int]) -> Queued[list[GenerateResult]]:
        self.steps.append((list(slots), max(0.0, time.perf_counter() - self.main.free_at)))
        return super().generate_start(slots)


@pytest.mark.parametrize("quiet", [16, 0])
async def test_a_new_streams_first_frame_queues_behind_a_quiet_step(quiet: int) -> None:
    """A turn that comes while a step of a few rows runs is taken at once and its first frame queued
    behind that step, so the device runs it with no gap (``quiet_rows``); with 0 the worker first
    waits for the running step's codes, and the device sits idle meanwhile."""
    model = _StepLogModel()
    flat = LevelConfig(onset_threshold_dbfs=-300.0, max_trim_ms=0.0)
    eng = Engine(EngineConfig(max_streams=8, level=flat, quiet_rows=quiet), model=model).start()
    try:
        busy = eng.open_stream(StreamParams(forced_frames=400))  # steps back to back, one row each
        busy.push_text("a long reply.")
        busy.end()
        reading = asyncio.ensure_future(_collect(busy))
        idle = []
        for _ in range(5):
            await asyncio.sleep(0.0137)
            n = len(model.steps)
            s = eng.open_stream(StreamParams(forced_frames=2))
            s.push_text("a new turn.")
            s.end()
            await asyncio.wait_for(_collect(s), 5)
            slot = next(slots for slots, _ in model.steps[n:] if len(slots) == 2)
            idle.append(next(gap for slots, gap in model.steps[n:] if slots is slot))
        busy.cancel()
        reading.cancel()
        await wait_engine_idle(eng)
    finally:
        eng.close()
    idle.sort()
    if quiet:
        assert idle[2] == 0.0  # queued behind the step that ran when it came (one may come in a gap)
    else:
        assert idle[0] > 0.0


class _SlowTextModel(_PipelinedModel):
    """_PipelinedModel whose text costs the worker ``TEXT_S`` a push (a tokenizer, a device write)."""

    TEXT_S = 0.001

    def __init__(self) -> None:
        super().__init__()
        self.pushes = 0
        self.pushes_at_step: list[int] = []  # pushes handled when each frame step began

    def add_text(self, slot: int, pieces: Sequence[str], final: bool) -> None:
        time.sleep(self.TEXT_S)
        self.pushes += 1

    def generate_start(self, slots: Sequence[int]) -> Queued[list[GenerateResult]]:
        self.pushes_at_step.append(self.pushes)
        return super().generate_start(slots)


async def test_a_flood_of_text_pushes_does_not_hold_the_frames_of_streams_that_have_their_text() -> None:
    """Hundreds of streams each streaming a word at a time send pushes faster than the worker handles
    them: it steps between them rather than after the last one."""
    model = _SlowTextModel()
    flat = LevelConfig(onset_threshold_dbfs=-300.0, max_trim_ms=0.0)
    eng = Engine(EngineConfig(max_streams=4, level=flat, queue_ahead_min_rows=0), model=model).start()
    try:
        speaking = eng.open_stream(StreamParams(forced_frames=100_000))
        speaking.push_text("a long turn.")
        speaking.end()
        listener = asyncio.create_task(_collect(speaking))

        async def until(done: Callable[[], bool]) -> None:
            while not done():
                await asyncio.sleep(0.002)

        await asyncio.wait_for(until(lambda: bool(model.pushes_at_step)), 10)
        words = eng.open_stream(StreamParams(forced_frames=100_000))
        before, n = model.pushes, 300
        for i in range(n):
            words.push_text(f"word{i} ")
        await asyncio.wait_for(until(lambda: model.pushes >= before + n), 10)
        during = [p for p in model.pushes_at_step if before < p < before + n]
        speaking.cancel()
        words.cancel()
        listener.cancel()
        await wait_engine_idle(eng)
    finally:
        eng.close()
    assert len(during) >= 10, f"{len(during)} frame steps while {n} pushes took {n * model.TEXT_S:.2f} s"
