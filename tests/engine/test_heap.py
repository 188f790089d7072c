"""The startup heap out of the collector's walks (heap.py), and the pauses it times."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import time

from voicewire.engine import Engine, EngineConfig
from voicewire.engine.heap import PAUSES

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


def _run(freeze: bool) -> list[str]:
    code = _FREEZE_UNTIL_CLOSE.format(freeze=freeze)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return out.stdout.split()


def test_a_warm_engine_takes_the_heap_out_of_collections_until_it_closes() -> None:
    frozen, kept, after_close, kept_after_close = _run(freeze=True)
    assert int(frozen) >= 1_000 and kept == "True"
    assert after_close == "0" and kept_after_close == "False"  # handed back, and collected


def test_without_freeze_heap_nothing_is_frozen() -> None:
    assert _run(freeze=False) == ["0", "False", "0", "False"]


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
