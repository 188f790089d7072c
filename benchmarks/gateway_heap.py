"""What a gateway process's full collection walks: the tracked objects an open WebSocket session holds
there, and how long a full collection takes at a load's peak.

    python benchmarks/gateway_heap.py --rate 40 --duration-s 10 --out gateway_heap_cpu.json

A gateway (the app ``voicewire serve`` runs, on 127.0.0.1) around an engine whose model makes its frames
at real time for free (``NullModel``, 4 frames a word), its heap frozen as a server's is once ready;
``voicewire probe`` in another process opens a session a turn, whole replies, open loop. Every half
second the run counts the objects the collector tracks beyond the frozen heap; at the peak it also
counts them by type and asyncio's tasks by coroutine, and times one full collection. A full
collection's pause grows with these objects: sessions live seconds, so theirs reach the oldest
generation, and under load every full collection walks all of them. The engine here runs in the
gateway's process (its streams' objects are counted too, ~20 a session); with ``serve --workers`` on a
GPU host it does not.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.realtime.gateway

from engine_load import load_config
from null_model import NullModel
from ws_bench import write_results

from tests.realtime.gateway import Gateway, gateway
from voicewire.engine import heap
from voicewire.engine.engine import Engine

FRAMES_PER_WORD = 4  # ~3 words a second at 12.5 frames a second, as speech goes
TOP_TYPES = 20


class RealTimeNull(NullModel):
    """A reply as long as its words take to say, made at real time (a step every frame's 80 ms)."""

    def add_text(self, slot: int, pieces: Sequence[str], final: bool) -> None:
        super().add_text(slot, pieces, final)
        self._left[slot] = self._left.get(slot, 0) + FRAMES_PER_WORD * sum(len(p.split()) for p in pieces)


def tracked() -> int:
    return len(gc.get_objects())  # the frozen (permanent) generation is not among them


def peak_breakdown(sessions: int) -> dict[str, Any]:
    objects = gc.get_objects()
    types = collections.Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in objects)
    del objects
    coros = [t.get_coro() for t in asyncio.all_tasks()]
    tasks = collections.Counter(getattr(c, "__qualname__", "?") for c in coros)
    t0 = time.perf_counter()
    gc.collect()
    full_ms = (time.perf_counter() - t0) * 1000
    per = max(sessions, 1)
    return {
        "sessions": sessions,
        "full_collection_ms": round(full_ms, 2),
        "types_per_session": {k: round(v / per, 1) for k, v in types.most_common(TOP_TYPES)},
        "tasks_per_session": {k: round(v / per, 2) for k, v in tasks.most_common(10)},
    }


def cyclic_garbage() -> collections.Counter[str]:
    """The types of what a full collection finds unreachable now (and frees)."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        return collections.Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.collect()


async def run(rate: float, duration_s: float) -> dict[str, Any]:
    model = RealTimeNull(max_slots=1024, max_batch=1024, step_s=0.08)
    engine = Engine(load_config("null", 1024), model=model).start()
    try:
        async with gateway(engine) as gw:
            return await measure(gw, rate, duration_s)
    finally:
        engine.close()


async def measure(gw: Gateway, rate: float, duration_s: float) -> dict[str, Any]:
    sessions = gw.sessions
    probe_out = str(Path(tempfile.mkdtemp()) / "probe.json")
    try:
        await asyncio.sleep(0.5)
        heap.freeze()  # as `voicewire serve` does once ready
        base = tracked()
        heap.PAUSES.install()
        heap.PAUSES.mark()
        full_before = heap.PAUSES.count[2]
        probe = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).parent / "voicewire"), "probe", "--url", gw.url,
            "--rate", str(rate), "--duration", str(duration_s), "--session-per-turn", "--whole",
            "--procs", "1", "--out", probe_out, "--plot", "",
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )
        samples: list[tuple[int, int]] = []
        longest_s = 0.0
        peak: dict[str, Any] = {}
        while probe.returncode is None:
            try:
                await asyncio.wait_for(probe.wait(), 0.5)
            except TimeoutError:
                pass
            n = len(sessions)
            samples.append((n, tracked() - base))
            # the breakdown once, past the load's middle: sessions have been open for a while
            if not peak and len(samples) >= duration_s and n > 0:
                longest_s = heap.PAUSES.max_since_mark_s
                peak = peak_breakdown(n)
                peak["tracked_beyond_frozen"] = samples[-1][1]
                heap.PAUSES.mark()  # the breakdown's own collection is not the load's
        longest_s = max(longest_s, heap.PAUSES.max_since_mark_s)
        full_collections = heap.PAUSES.count[2] - full_before - (1 if peak else 0)
        await asyncio.sleep(1.0)  # the last sessions' ends
        garbage = cyclic_garbage()
        turns = json.loads(Path(probe_out).read_text())["summary"]["turns"]
        busy = [(n, o) for n, o in samples if n > 0]
        per_session = sum(o for _, o in busy) / max(sum(n for n, _ in busy), 1)
        return {
            "rate": rate,
            "duration_s": duration_s,
            "probe_rc": probe.returncode,
            "sessions_max": max((n for n, _ in samples), default=0),
            "tracked_per_session": round(per_session, 1),
            "turns": turns,
            # what closed sessions left that only a collection frees (reference cycles), a turn
            "after_the_load": {
                "garbage": sum(garbage.values()),
                "garbage_per_turn": round(sum(garbage.values()) / max(turns, 1), 1),
                "garbage_types": dict(garbage.most_common(12)),
            },
            # the collections the load set off (not the breakdown's or the garbage count's)
            "collections_since_frozen": {"full": full_collections, "longest_ms": round(longest_s * 1000, 2)},
            "peak": peak,
            "samples": samples,
        }
    finally:
        heap.release()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=40.0, help="turns a second, open loop, a session each")
    ap.add_argument("--duration-s", type=float, default=10.0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    result = asyncio.run(run(args.rate, args.duration_s))
    write_results(result, args.out)
    print(
        f"{result['sessions_max']} sessions at most, {result['tracked_per_session']} tracked objects a "
        f"session, {result['after_the_load']['garbage_per_turn']} left for the collector a turn, a full "
        f"collection at the peak {result['peak'].get('full_collection_ms')} ms"
    )


if __name__ == "__main__":
    main()
