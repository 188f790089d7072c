"""The warm load (engine/warm_load.py): before the engine says ready it has run its streams through
the worker, a full batch at once among them, and none of it shows in the stats a server reports."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

from voicewire.engine import Engine, EngineConfig
from voicewire.engine.qwen3 import load_qwen3

BATCH = 6


def test_the_engine_is_ready_only_after_its_warm_load_ran_a_full_batch(device: str) -> None:
    model = load_qwen3(
        None, "tiny", device=device, seed=3, max_slots=BATCH, max_batch_size=BATCH, max_seq_len=256
    )
    model.info = dataclasses.replace(model.info, warm_load_streams=BATCH)
    engine = Engine(EngineConfig(max_streams=BATCH), model=model)
    ready_at_open: list[bool] = []
    batches: list[int] = []
    open_slot, generate_start = model.open_slot, model.generate_start

    def counting_open(slot: int, params):  # type: ignore[no-untyped-def]
        ready_at_open.append(engine.ready)
        open_slot(slot, params)

    def counting_generate(slots: Sequence[int]):  # type: ignore[no-untyped-def]
        batches.append(len(slots))
        return generate_start(slots)

    model.open_slot, model.generate_start = counting_open, counting_generate  # type: ignore[method-assign]
    engine.start()
    try:
        assert engine.ready
        # the model's own warm-up opens a slot too; every warm stream ran before ready
        assert len(ready_at_open) >= BATCH and not any(ready_at_open)
        assert max(batches) == BATCH  # the full batch's step ran
        assert engine.stats.streams_opened == 0 and engine.stats.frames_generated == 0

        async def one_turn() -> int:
            stream = engine.open_stream(forced_frames=3)
            stream.push_text("Hello there.")
            stream.end()
            return sum([len(c.pcm) async for c in stream])

        assert asyncio.run(one_turn()) > 0
        assert engine.stats.streams_opened == 1
    finally:
        engine.close()


def test_an_engine_started_from_a_coroutine_runs_its_warm_load(device: str) -> None:
    """Engine.start() called on a running loop (an async app's start-up) still warms before ready."""
    model = load_qwen3(None, "tiny", device=device, seed=3, max_slots=2, max_batch_size=2, max_seq_len=256)
    model.info = dataclasses.replace(model.info, warm_load_streams=2)
    opened: list[int] = []
    open_slot = model.open_slot
    model.open_slot = lambda slot, params: (opened.append(slot), open_slot(slot, params))[1]  # type: ignore[method-assign]

    async def start_and_speak() -> int:
        engine = Engine(EngineConfig(max_streams=2), model=model).start()
        try:
            assert engine.ready and len(opened) >= 3  # the model's own warm-up slot and two warm streams
            stream = engine.open_stream(forced_frames=3)
            stream.push_text("Hello there.")
            stream.end()
            return sum([len(c.pcm) async for c in stream])
        finally:
            engine.close()

    assert asyncio.run(start_and_speak()) > 0
