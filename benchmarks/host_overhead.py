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

``--device qwen3`` runs the real Qwen3-TTS model's host code with its device work short-circuited
(qwen3_null_device.py): the worker's time per step and per command is then the served engine's
host cost, the model's own included, as a GPU step that took no time would leave it.
``--words-per-s`` streams each turn's text a word a delta (many small text commands), as an LLM does;
``--concurrency`` keeps that many turns going (a closed loop): full batches, steady, for the time
per step at the batch size.

    python3 benchmarks/host_overhead.py --device qwen3 --concurrency 320 --out qwen3_host_cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
from qwen3_null_device import null_device_qwen3
from simulated_h200 import H200_HOST_MS, H200Model
from torch.overrides import TorchFunctionMode

from voicewire.engine.config import EngineConfig
from voicewire.engine.engine import Engine
from voicewire.engine.model import Model


class TorchCalls(TorchFunctionMode):
    """Counts the torch calls made inside it (functions and tensor methods): on a GPU each is a
    kernel launch or a trip through the dispatcher, host time the CPU's run underrates."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.n += 1
        return func(*args, **(kwargs or {}))


class WorkerProfile:
    """The engine's worker thread measured: each step's time and batch rows (``by_rows``), and with
    ``profile`` a cProfile of ``Engine._step`` and of the loop's work between steps (which streams
    are ready, the command drain); with ``torch_calls`` the torch calls of each step (slower)."""

    # the worker's methods that its loop calls, each profiled where it is not inside another
    BETWEEN_STEPS = ("_expire_queued", "_ready", "_decode_pending", "_drain")
    ROW_BINS = (1, 64, 128, 192, 240, 256)  # by_rows: steps of rows in [lo, next lo); the last alone

    def __init__(self, engine: Engine, profile: bool, torch_calls: bool = False) -> None:
        self.prof = cProfile.Profile()
        self.profile = profile
        self.calls = TorchCalls() if torch_calls else None
        self.ticks = 0
        self.busy_s = 0.0
        self.on = False
        # (rows, seconds, of which commands, the worker thread's CPU seconds, torch calls) of each step
        self.steps: list[tuple[int, float, float, float, int]] = []
        self._depth = 0
        self._rows = 0
        step, stats = engine._step, engine.stats
        record = stats.record_step

        def record_step(generate_s: float, decode_s: float, batch: int, device_wait_s: float) -> None:
            self._rows = batch
            record(generate_s, decode_s, batch, device_wait_s)

        def tick(ready: set[int]) -> None:
            t0, cpu0, n0, c0 = time.perf_counter(), time.thread_time(), stats.steps, stats.commands_s
            calls0 = self.calls.n if self.calls is not None else 0
            with self.calls if self.calls is not None else contextlib.nullcontext():
                self._run(step, ready)
            if self.on:
                dt = time.perf_counter() - t0
                self.ticks += 1
                self.busy_s += dt
                if stats.steps > n0:
                    calls = self.calls.n - calls0 if self.calls is not None else 0
                    self.steps.append((self._rows, dt, stats.commands_s - c0, time.thread_time() - cpu0, calls))

        stats.record_step = record_step  # type: ignore[method-assign]
        engine._step = tick  # type: ignore[method-assign]
        for name in self.BETWEEN_STEPS:
            setattr(engine, name, self._wrapped(getattr(engine, name)))

    def _wrapped(self, fn: Any) -> Any:
        return lambda *a, **kw: self._run(fn, *a, **kw)

    def _run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        outer = self.on and self.profile and self._depth == 0
        self._depth += 1
        if outer:
            self.prof.enable()
        try:
            return fn(*args, **kwargs)
        finally:
            self._depth -= 1
            if outer:
                self.prof.disable()

    def by_rows(self) -> dict[str, dict[str, float]]:
        """Steps by batch rows: how many, their mean time in ms (the model's device time included:
        none for ``--device qwen3``), that less the commands taken inside the step, and the worker
        thread's CPU time (its time less its waits for the interpreter's lock, which the client's
        loop holds meanwhile, and for the device)."""
        out = {}
        bins = self.ROW_BINS
        for lo, hi in zip(bins, (*bins[1:], bins[-1] + 1), strict=True):
            steps = [(s, c, cpu, k) for rows, s, c, cpu, k in self.steps if lo <= rows < hi]
            if steps:
                n = len(steps)
                out[f"{lo}-{hi - 1}"] = {
                    "steps": n,
                    "ms_per_step": 1e3 * sum(s for s, _, _, _ in steps) / n,
                    "ms_per_step_less_commands": 1e3 * sum(s - c for s, c, _, _ in steps) / n,
                    "cpu_ms_per_step": 1e3 * sum(cpu for _, _, cpu, _ in steps) / n,
                }
                if self.calls is not None:
                    out[f"{lo}-{hi - 1}"]["torch_calls_per_step"] = sum(k for _, _, _, k in steps) / n
        return out

    def top(self, n: int = 25, sort: str = "tottime") -> str:
        buf = io.StringIO()
        pstats.Stats(self.prof, stream=buf).sort_stats(sort).print_stats(n)
        return buf.getvalue()


def _host_work(args: argparse.Namespace) -> dict[str, float] | None:
    if not args.host_work:
        return None
    work = dict(H200_HOST_MS)
    if args.open_ms is not None:
        work["open"] = args.open_ms
    return work


def run(args: argparse.Namespace) -> dict[str, Any]:
    model: NullModel | Model
    if args.device == "h200":
        model = H200Model(args.max_slots, args.max_batch, _host_work(args))
    elif args.device == "qwen3":
        model = null_device_qwen3(args.max_slots, args.max_batch)
    else:
        model = NullModel(args.max_slots, args.max_batch, args.step_ms / 1e3, args.row_us / 1e6)
    cfg = load_config(
        "null",
        args.max_slots,
        queue_ahead=not args.no_queue_ahead,
        queue_ahead_min_rows=args.queue_ahead_min_rows,
        max_decodes_in_flight=args.decodes_in_flight,
        freeze_heap=not args.no_freeze_heap,
    )
    engine = Engine(cfg, model=model).start()
    prof = WorkerProfile(engine, args.profile, args.torch_calls)
    res: dict[str, Any] = {}

    async def main() -> None:
        await closed_loop(engine, 4, 1.0, Lengths(), 999)
        prof.on = True
        dev = model.device if isinstance(model, H200Model) else None
        busy0, work0, calls0 = (dict(dev.busy_s), dict(dev.work_ms), dict(dev.calls)) if dev else ({}, {}, {})
        t0 = time.perf_counter()
        if args.concurrency:
            r = await closed_loop(engine, args.concurrency, args.duration_s, Lengths(), 1, args.words_per_s)
        else:
            r = await open_loop(engine, args.rate, args.duration_s, Lengths(), 1, args.words_per_s)
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
    res["host_us_per_row"] = 1e6 * eng["generate_s"] / max(1, rows) if rows else None
    res["us_per_command"] = eng.get("us_per_command")
    res["worker_busy_ms_per_tick"] = 1e3 * prof.busy_s / max(1, prof.ticks)
    res["step_ms_by_rows"] = prof.by_rows()
    if args.profile:
        res["worker_top"] = prof.top()
        res["worker_top_cumulative"] = prof.top(40, "cumulative")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=230.0)
    ap.add_argument(
        "--concurrency", type=int, default=0, help="a closed loop of this many turns at once instead of --rate"
    )
    ap.add_argument("--duration-s", type=float, default=6.0)
    ap.add_argument("--max-slots", type=int, default=512)
    ap.add_argument("--max-batch", type=int, default=256)
    # the served 1.7B frame step on the H200 under load: ~5 ms at a few rows, ~14 ms at 256
    ap.add_argument("--step-ms", type=float, default=5.0)
    ap.add_argument("--row-us", type=float, default=35.0)
    ap.add_argument(
        "--device", choices=("none", "h200", "qwen3"), default="none", help="h200: H200Model; qwen3: docstring"
    )
    ap.add_argument("--words-per-s", type=float, default=None, help="stream each turn's text a word a delta")
    ap.add_argument("--no-queue-ahead", action="store_true", help="EngineConfig.queue_ahead off")
    ap.add_argument("--queue-ahead-min-rows", type=int, default=EngineConfig.queue_ahead_min_rows)
    ap.add_argument("--no-freeze-heap", action="store_true", help="EngineConfig.freeze_heap off (heap.py)")
    ap.add_argument("--decodes-in-flight", type=int, default=1, help="EngineConfig.max_decodes_in_flight")
    ap.add_argument(
        "--host-work", action="store_true", help="h200: spin the served model's host time a call (H200_HOST_MS)"
    )
    ap.add_argument("--open-ms", type=float, default=None, help="with --host-work: host time a slot's open")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--torch-calls", action="store_true", help="count each step's torch calls (slows it)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    res = {"command": " ".join(sys.argv), **run(args)}
    Path(args.out).write_text(json.dumps(res, indent=1, default=str))
    show = {k: v for k, v in res.items() if not k.startswith("worker_top") and k != "load"}
    load = res["load"]
    show["load"] = {k: load[k] for k in ("requests", "rejected", "errors", "ttfp_ms_p50", "ttfp_ms_p95", "engine")}
    print(json.dumps(show, default=str))
    if args.profile:
        print(res["worker_top"])
        print(res["worker_top_cumulative"])


if __name__ == "__main__":
    main()
