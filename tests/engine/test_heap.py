"""The startup heap out of the collector's walks (heap.py), the oldest generation held to the moments no
stream is in flight, and the pauses it times."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import time

import pytest

from voicewire.engine import Engine, EngineConfig
from voicewire.engine.heap import HELD_THRESHOLD, PAUSES

# In a process of its own: this one's session engine (tests/conftest.py) keeps its heap frozen.
_FREEZE_UNTIL_CLOSE = textwrap.dedent(
    """
    import gc, weakref
    from voicewire.engine import Engine, EngineConfig

    class Node:
        def __init__(self):
            self.me = self  # a cycle: only the collector frees it

    built = [Node() for _ in range(1_000)]  # what a model's load leaves behind
    dropped = weakref.ref(built[0])
    engine = Engine(EngineConfig(freeze_heap={freeze})).start()
    frozen = gc.get_freeze_count()
    del built
    gc.collect()
    kept = dropped() is not None  # frozen: no collection walks it
    engine.close()
    gc.collect()
    print(frozen, kept, gc.get_freeze_count(), dropped() is not None)
    """
)


def _run(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return out.stdout.split()


def test_a_warm_engine_takes_the_heap_out_of_collections_until_it_closes() -> None:
    frozen, kept, after_close, kept_after_close = _run(_FREEZE_UNTIL_CLOSE.format(freeze=True))
    assert int(frozen) >= 1_000 and kept == "True"
    assert after_close == "0" and kept_after_close == "False"  # handed back, and collected


def test_without_freeze_heap_nothing_is_frozen() -> None:
    assert _run(_FREEZE_UNTIL_CLOSE.format(freeze=False)) == ["0", "False", "0", "False"]


def test_every_collection_is_timed() -> None:
    engine = Engine(EngineConfig(freeze_heap=False)).start()
    try:
        full, full_s = PAUSES.count[2], PAUSES.seconds[2]
        t0 = time.perf_counter()
        gc.collect()
        t1 = time.perf_counter()
        assert PAUSES.count[2] == full + 1
        assert 0 < PAUSES.seconds[2] - full_s < t1 - t0
    finally:
        engine.close()


def test_the_pauses_since_ready_leave_out_the_ones_before() -> None:
    big = [[i] for i in range(300_000)]  # a start-up heap: its full collection takes a while
    gc.collect()
    assert PAUSES.max_s >= PAUSES.seconds[2] / max(1, PAUSES.count[2]) > 0
    engine = Engine(EngineConfig(freeze_heap=False)).start()
    try:
        assert PAUSES.max_since_mark_s < PAUSES.max_s  # the start's collections are not counted
        del big
        gc.collect(0)
        assert 0 < PAUSES.max_since_mark_s <= PAUSES.max_s
    finally:
        engine.close()


# In a process of its own, as above: a stream in flight (text pushed, not ended) while cyclic garbage
# sits in the oldest generation with as many young collections behind it as a full one waits for.
_QUIET_COLLECTION = textwrap.dedent(
    """
    import asyncio, gc, weakref
    from voicewire.engine import Engine, EngineConfig
    from voicewire.engine.heap import QUIET

    class Node:
        def __init__(self):
            self.me = self

    async def main():
        engine = Engine(EngineConfig(full_collection_busy_max_s={busy_max_s})).start()
        own = gc.get_threshold()
        stream = engine.open_stream()
        stream.push_text("Hello there.")
        await asyncio.sleep({busy_s})
        threshold_while_busy = gc.get_threshold()[2]
        nodes = [Node() for _ in range(100)]
        dropped = weakref.ref(nodes[0])
        gc.collect(1)  # alive: promoted to the oldest generation
        del nodes
        for _ in range(own[2]):
            gc.collect(1)
        stream.end()
        async for _ in stream:
            pass
        while engine.active_streams():
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # the worker's next pass sees none in flight
        own_back = gc.get_threshold() == own
        print(threshold_while_busy, dropped() is None, own_back, QUIET.collections, QUIET.overruns)
        engine.close()

    asyncio.run(main())
    """
)


def _quiet_run(busy_max_s: float | None, busy_s: float) -> list[str]:
    return _run(_QUIET_COLLECTION.format(busy_max_s=busy_max_s, busy_s=busy_s))


def test_the_oldest_generation_waits_for_the_last_stream_to_end() -> None:
    held, collected, own_rule_back, quiet_collections, overruns = _quiet_run(busy_max_s=60.0, busy_s=0.2)
    assert int(held) == HELD_THRESHOLD
    assert collected == "True" and own_rule_back == "True"
    assert (quiet_collections, overruns) == ("1", "0")


def test_busy_past_its_bound_the_collector_has_its_own_rule_back() -> None:
    held, collected, own_rule_back, _, overruns = _quiet_run(busy_max_s=0.3, busy_s=1.2)
    assert int(held) == gc.get_threshold()[2] != HELD_THRESHOLD and overruns == "1"
    assert collected == "True" and own_rule_back == "True"


@pytest.mark.parametrize("busy_max_s", [0.0, None], ids=["off", "in-process-default"])
def test_off_or_in_a_gateways_process_the_collector_keeps_its_own_rule(busy_max_s: float | None) -> None:
    held, collected, own_rule_back, quiet_collections, _ = _quiet_run(busy_max_s=busy_max_s, busy_s=0.2)
    assert int(held) != HELD_THRESHOLD and own_rule_back == "True"
    assert quiet_collections == "0" and collected == "False"  # left for the collector's own counts
