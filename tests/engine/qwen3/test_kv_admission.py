"""Admission by KV blocks (engine/admission.py ``kv_admits``): with a pool too small for every
stream at once, new streams wait for blocks instead of starting and running the pool dry."""

from __future__ import annotations

import asyncio

from voicewire.engine import Engine, EngineConfig, StreamError
from voicewire.engine.qwen3 import load_qwen3
from voicewire.engine.qwen3.options import ServeOptions

FRAMES = 100  # with the prompt, two 64-position blocks a stream


def test_streams_wait_for_blocks_rather_than_run_the_pool_dry(device: str) -> None:
    # three usable blocks: one stream at a time gets its two
    opts = ServeOptions(max_slots=3, max_batch_size=3, max_seq_len=256, kv_blocks=1 + 3)
    model = load_qwen3(None, "tiny", device=device, seed=3, options=opts)
    engine = Engine(EngineConfig(max_streams=3, queue_wait_s=60.0), model=model).start()
    open_slot, close_slot = model.open_slot, model.close_slot
    held: set[int] = set()
    open_at_once: list[int] = []  # slots already held when each stream opened

    def counting_open(slot: int, params):  # type: ignore[no-untyped-def]
        open_at_once.append(len(held))
        held.add(slot)
        open_slot(slot, params)

    def counting_close(slot: int) -> None:
        held.discard(slot)
        close_slot(slot)

    model.open_slot, model.close_slot = counting_open, counting_close  # type: ignore[method-assign]

    async def turn(i: int) -> int:
        stream = engine.open_stream(forced_frames=FRAMES, seed=i)
        stream.push_text("Hello there.")
        stream.end()
        return sum([len(c.pcm) async for c in stream])

    async def all_turns() -> list[int | BaseException]:
        return await asyncio.gather(*(turn(i) for i in range(3)), return_exceptions=True)

    try:
        results = asyncio.run(all_turns())
        assert not [r for r in results if isinstance(r, StreamError | BaseException)], results
        assert all(isinstance(r, int) and r > 0 for r in results)
        assert max(open_at_once) <= 1  # each waited until the one before gave its blocks back
    finally:
        engine.close()
