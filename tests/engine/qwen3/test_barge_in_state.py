"""A load with barge-ins (streams cancelled while they speak) leaves the engine and the model as it
found them: every KV block back in the pool, no slot held, no codec work or stream left behind, so
the next load runs on the same engine as the first did."""

from __future__ import annotations

import asyncio
import time

from voicewire.engine import Engine, EngineConfig
from voicewire.engine.qwen3 import load_qwen3
from voicewire.engine.qwen3.options import ServeOptions

FRAMES = 90  # two 64-position blocks a stream with its prompt: a cut stream holds blocks mid-way


def test_streams_cut_while_speaking_give_back_all_they_held(device: str) -> None:
    opts = ServeOptions(max_slots=4, max_batch_size=4, max_seq_len=256)
    model = load_qwen3(None, "tiny", device=device, seed=3, options=opts)
    engine = Engine(EngineConfig(max_streams=4, queue_wait_s=60.0), model=model).start()
    pool = model.kv.pool

    async def turn(i: int, cut_after: int | None) -> int:
        stream = engine.open_stream(forced_frames=FRAMES, seed=i)
        stream.push_text("Hello there, this is a test.")
        if cut_after is None:
            stream.end()
        chunks = 0
        async for _ in stream:
            chunks += 1
            if cut_after is not None and chunks == cut_after:
                stream.cancel()  # the listener spoke: the rest of the reply is dropped
                break
        return chunks

    async def wave() -> list[int]:
        # half the turns cut after their first or second chunk, some before their text has ended
        return await asyncio.gather(*(turn(i, (None, 1, None, 2)[i % 4]) for i in range(8)))

    def settled() -> bool:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if engine.active_streams() == 0 and pool.free_blocks == pool.usable_blocks:
                return True
            time.sleep(0.02)
        return False

    try:
        for _ in range(2):
            chunks = asyncio.run(wave())
            assert all(c > 0 for c in chunks), chunks
            assert settled(), (engine.active_streams(), pool.free_blocks, pool.usable_blocks)
            assert not model._slots  # every slot closed on the model, not only freed by the engine
            assert all(pool.owned(s) == 0 for s in range(opts.max_slots))
    finally:
        engine.close()
