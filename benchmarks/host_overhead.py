"""The engine's own host cost at serving scale: a model that costs nothing, hundreds of streams.

    python3 benchmarks/host_overhead.py --rate 230 --out host_overhead_cpu.json [--profile]
    python3 benchmarks/host_overhead.py --device h200 --rate 200 --out h200_sim_cpu.json

The engine (scheduler, text feeding, chunk planning, emitting, the event loop's consumers) runs
exactly as served, in-process with the open-loop client of engine_load.py, around ``NullModel``:
Qwen3-TTS-12Hz's shape (24 kHz, 1920 samples a frame, word text, 256 rows a step, 512 slots) whose
generate and decode do no host work but wait (without the interpreter's lock, as a CUDA sync does)
as long as the H200's frame step at that batch (``--step-ms`` + ``--row-us`` per row). What the run
reaches is the ceiling the host puts on any model: frames per second, the worker's time per tick and
per row, and how late the client's loop runs (both threads share the interpreter's lock).
``--profile`` adds the worker thread's top functions.

``--device h200`` swaps in simulated_h200.py's ``H200Model``: Qwen3-TTS on CUDA as the engine sees it,
its work timed from the H200's measured graphs on two simulated device queues; the JSON then also
says how busy those were and what each kind of work cost a second.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_load import Lengths, closed_loop, load_config, open_loop
from null_model import NullModel
from simulated_h200 import H200_HOST_MS, H200Model

from voicewire.engine.engine import Engine


class WorkerProfile:
    """cProfile of the engine's worker thread (``Engine._step`` and the command drain)."""

    def __init__(self, engine: Engine) -> None:
        self.prof = cProfile.Profile()
        self.ticks = 0
        self.busy_s = 0.0
        self.on = False
        step = engine._step

        def tick(ready: set[int]) -> None:
            t0 = time.perf_counter()
            if self.on:
                self.prof.enable()
            try:
                step(ready)
            finally:
                if self.on:
                    self.prof.disable()
                    self.ticks += 1
                    self.busy_s += time.perf_counter() - t0

        engine._step = tick  # type: ignore[method-assign]

    def top(self, n: int = 25) -> str:
        buf = io.StringIO()
        pstats.Stats(self.prof, stream=buf).sort_stats("tottime").print_stats(n)
        return buf.getvalue()


def _host_work(args: argparse.Namespace) -> dict[str, float] | None:
    if not args.host_work:
        return None
    work = dict(H200_HOST_MS)
    if args.open_ms is not None:
        work["open"] = args.open_ms
    return work


def run(args: argparse.Namespace) -> dict[str, Any]:
    model = (
        H200Model(args.max_slots, args.max_batch, _host_work(args))
        if args.device == "h200"
        else NullModel(args.max_slots, args.max_batch, args.step_ms / 1e3, args.row_us / 1e6)
    )
    cfg = load_config(
        "null",
        args.max_slots,
        queue_ahead=not args.no_queue_ahead,
        max_decodes_in_flight=args.decodes_in_flight,
        freeze_heap=not args.no_freeze_heap,
    )
    engine = Engine(cfg, model=model).start()
    prof = WorkerProfile(engine)
    res: dict[str, Any] = {}

    async def main() -> None:
        await closed_loop(engine, 4, 1.0, Lengths(), 999)
        prof.on = args.profile
        dev = model.device if isinstance(model, H200Model) else None
        busy0, work0, calls0 = (dict(dev.busy_s), dict(dev.work_ms), dict(dev.calls)) if dev else ({}, {}, {})
        t0 = time.perf_counter()
        r = await open_loop(engine, args.rate, args.duration_s, Lengths(), 1)
        r.pop("arrivals", None)
        r["wall_s"] = time.perf_counter() - t0
        res["load"] = r
        if dev is not None:  # the simulated GPU: its queues busy, and each kind's work alone, over the run
            wall = r["wall_s"]
            res["device_busy"] = {k: (v - busy0[k]) / wall for k, v in dev.busy_s.items()}
            res["device_ms_per_s_alone"] = {k: (v - work0.get(k, 0.0)) / wall for k, v in dev.work_ms.items()}
            res["device_calls_per_s"] = {k: (v - calls0.get(k, 0)) / wall for k, v in dev.calls.items()}
            shapes = model.codec_shapes
            res["codec_calls"] = {f"{b}x{t}": n for (b, t), n in sorted(shapes.items())}
            res["codec_padded_frames_per_frame"] = sum(b * t * n for (b, t), n in shapes.items()) / max(
                1, model.codec_frames
            )
        prof.on = False

    try:
        asyncio.run(main())
    finally:
        engine.close()
    eng = res["load"]["engine"]
    hist = {int(k): v for k, v in eng["batch_hist"].items()}
    rows = sum(k * v for k, v in hist.items())
    steps = sum(hist.values())
    wall = res["load"]["wall_s"]
    res["frames_per_s"] = rows / wall
    res["rows_per_step"] = rows / max(1, steps)
    res["host_ms_per_step"] = eng.get("host_ms_per_step")
    res["host_us_per_row"] = 1e3 * eng["generate_s"] / max(1, rows) if rows else None
    if args.profile:
        res["worker_busy_ms_per_tick"] = 1e3 * prof.busy_s / max(1, prof.ticks)
        res["worker_top"] = prof.top()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=230.0)
    ap.add_argument("--duration-s", type=float, default=6.0)
    ap.add_argument("--max-slots", type=int, default=512)
    ap.add_argument("--max-batch", type=int, default=256)
    # the served 1.7B frame step on the H200 under load: ~5 ms at a few rows, ~14 ms at 256
    ap.add_argument("--step-ms", type=float, default=5.0)
    ap.add_argument("--row-us", type=float, default=35.0)
    ap.add_argument("--device", choices=("none", "h200"), default="none", help="h200: H200Model (docstring)")
    ap.add_argument("--no-queue-ahead", action="store_true", help="EngineConfig.queue_ahead off")
    ap.add_argument("--no-freeze-heap", action="store_true", help="EngineConfig.freeze_heap off (heap.py)")
    ap.add_argument("--decodes-in-flight", type=int, default=1, help="EngineConfig.max_decodes_in_flight")
    ap.add_argument(
        "--host-work", action="store_true", help="h200: spin the served model's host time a call (H200_HOST_MS)"
    )
    ap.add_argument("--open-ms", type=float, default=None, help="with --host-work: host time a slot's open")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    res = {"command": " ".join(sys.argv), **run(args)}
    Path(args.out).write_text(json.dumps(res, indent=1, default=str))
    show = {k: v for k, v in res.items() if k != "worker_top"}
    print(json.dumps(show, default=str)[:1500])
    if args.profile:
        print(res["worker_top"])


if __name__ == "__main__":
    main()
