from __future__ import annotations

import asyncio
import time

from voicewire.engine.loop_lag import LoopLag


async def test_a_held_loop_is_one_stall_about_as_long_as_the_hold() -> None:
    lag = LoopLag()
    lag.start()
    await asyncio.sleep(0.02)
    t0 = time.perf_counter()
    time.sleep(0.1)  # a callback holding the loop (a full collection, a long handler)
    t1 = time.perf_counter()
    await asyncio.sleep(0.02)
    lag.stop()
    held = lag.between(t0, t1)
    assert len(held) == 1 and 0.09 <= held[0].seconds <= 0.5, held
    assert lag.max_s >= 0.09 and lag.max_since_mark_s == lag.max_s and lag.stalls >= 1
    lag.mark()
    assert lag.max_since_mark_s == 0.0 and lag.max_s >= 0.09
