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

``--device h200`` swaps in ``H200Model``: Qwen3-TTS on CUDA as the engine sees it (two frame steps in
flight, the codec on a queue of its own, taken once done), each piece of work timed from the H200's
measured graphs (``H200_*`` below: the decode graph per batch, the prefill per call, the codec per
(streams, frames) call, split as the served codec plan splits a tick's chunks) on two in-order
device queues that share the GPU when both run (each at ``SHARED_RATE``). So the pipeline's
scheduling can be tried here, at the GPU's speed, before a device run measures it.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import dataclasses
import io
import itertools
import json
import pstats
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_load import Lengths, closed_loop, load_config, open_loop

from voicewire.engine.engine import Engine
from voicewire.engine.model import (
    Decoded,
    DecodeWork,
    GenerateResult,
    Model,
    ModelInfo,
    Queued,
    StreamParams,
    TextGranularity,
)
from voicewire.engine.qwen3.codec_plan import padded_frames, plan_codec_calls
from voicewire.engine.qwen3.cuda_graphs import bucket_for, frame_ladder, powers_of_two
from voicewire.engine.qwen3.model import _default_buckets

FRAME_SAMPLES = 1920


class NullModel(Model):
    """Frames for free: one (1, 16) payload per ready slot per step, silence per decoded frame."""

    def __init__(self, max_slots: int, max_batch: int, step_s: float = 0.0, row_s: float = 0.0) -> None:
        self.step_s, self.row_s = step_s, row_s
        self.info = ModelInfo(
            name="null",
            sample_rate_hz=24_000,
            frame_samples=FRAME_SAMPLES,
            text_granularity=TextGranularity.WORD,
            max_batch_size=max_batch,
            max_slots=max_slots,
            voices=("null",),
            random_weights=True,
        )
        self._left: dict[int, int] = {}
        self._final: dict[int, bool] = {}
        self._codes = np.zeros((1, 16), np.int64)

    def open_slot(self, slot: int, params: StreamParams) -> None:
        self._left[slot] = params.forced_frames or 1
        self._final[slot] = False

    def add_text(self, slot: int, pieces: Sequence[str], final: bool) -> None:
        self._final[slot] = self._final[slot] or final

    def ready(self, slot: int) -> bool:
        return self._final.get(slot, False) and self._left.get(slot, 0) > 0

    def generate(self, slots: Sequence[int]) -> list[GenerateResult]:
        if self.step_s or self.row_s:
            time.sleep(self.step_s + self.row_s * len(slots))  # the device's step, the lock released
        out = []
        for s in slots:
            self._left[s] -= 1
            out.append(GenerateResult(s, self._codes, 1, self._left[s] == 0))
        return out

    def decode(self, work: Sequence[DecodeWork]) -> list[np.ndarray]:
        return [np.zeros(w.n_frames * FRAME_SAMPLES, np.float32) for w in work]

    def close_slot(self, slot: int) -> None:
        self._left.pop(slot, None)
        self._final.pop(slot, None)


# The served 1.7B engine's graphs on one H200 (bf16, ms): the decode graph per batch bucket
# (step_1.7b_h200.json, step_profile_large_batch_h200.json), the prefill of b prompts of 16 positions
# (2.41 ms for 8, 4.49 for 32), the codec per (streams, frames) call (throughput_h200.json [codec]).
H200_DECODE_MS = {1: 2.92, 64: 5.77, 128: 7.01, 256: 8.46, 512: 13.59}
H200_PREFILL_MS = (1.72, 0.0867)  # + per prompt
H200_CODEC_MS = {
    1: {1: 1.69, 2: 1.81, 4: 1.83, 12: 1.96, 24: 2.22, 48: 2.72},
    4: {1: 1.90, 2: 1.97, 4: 2.13, 12: 2.85, 24: 3.92, 48: 5.97},
    16: {1: 2.37, 2: 2.86, 4: 3.50, 12: 6.28, 24: 9.98, 48: 17.70},
    64: {1: 4.56, 2: 6.22, 4: 8.59, 12: 18.57, 24: 33.97, 48: 65.72},
}
# The decode graph at 256 rows beside a codec graph and a codec graph beside it: both chains at once
# take 96% of their time back to back (overlap_contention_h200.json), so each runs at ~0.52
SHARED_RATE = 0.52


def _interp(table: dict[int, float], x: float) -> float:
    """Piecewise linear in ``x``; past the last key in proportion to it."""
    keys = sorted(table)
    if x <= keys[0]:
        return table[keys[0]]
    for lo, hi in itertools.pairwise(keys):
        if x <= hi:
            return table[lo] + (x - lo) / (hi - lo) * (table[hi] - table[lo])
    return table[keys[-1]] * x / keys[-1]


def codec_call_ms(rows: int, frames: int) -> float:
    return _interp({b: _interp(row, frames) for b, row in H200_CODEC_MS.items()}, rows)


class DeviceQueues:
    """Two in-order device queues (the frame steps', the codec's) sharing one GPU: a piece of work
    starts when the one before it on its queue is done, runs at full speed alone and at SHARED_RATE
    while the other queue runs too. Advanced lazily to the wall clock whenever it is asked."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.queues: dict[str, list[list[float]]] = {"main": [], "codec": []}  # [ms left alone, id]
        self.done: set[int] = set()
        self.t = time.perf_counter()
        self.ids = itertools.count()
        self.busy_s = {"main": 0.0, "codec": 0.0, "either": 0.0}
        self.wait_s = 0.0  # the worker blocked on the device (Model.device_wait_s)
        self.work_ms: dict[str, float] = {}  # each kind's work as timed alone, and its calls
        self.calls: dict[str, int] = {}

    def _advance(self, until: float) -> None:
        while self.t < until:
            heads = [q[0] for q in self.queues.values() if q]
            if not heads:
                self.t = until
                return
            rate = 1.0 if len(heads) == 1 else SHARED_RATE
            dt = min(until - self.t, min(h[0] for h in heads) / 1e3 / rate)
            for name, q in self.queues.items():
                if q:
                    q[0][0] -= dt * 1e3 * rate
                    self.busy_s[name] += dt
            self.busy_s["either"] += dt
            self.t += dt
            for q in self.queues.values():
                while q and q[0][0] <= 1e-9:
                    self.done.add(int(q.pop(0)[1]))

    def submit(self, queue: str, ms: float, kind: str) -> int:
        self.work_ms[kind] = self.work_ms.get(kind, 0.0) + ms
        self.calls[kind] = self.calls.get(kind, 0) + 1
        with self.lock:
            self._advance(time.perf_counter())
            job = next(self.ids)
            self.queues[queue].append([ms, job])
            return job

    def is_done(self, job: int) -> bool:
        with self.lock:
            self._advance(time.perf_counter())
            return job in self.done

    def wait(self, job: int) -> None:
        t0 = time.perf_counter()
        try:
            self._wait(job)
        finally:
            self.wait_s += time.perf_counter() - t0

    def _wait(self, job: int) -> None:
        while True:
            with self.lock:
                self._advance(time.perf_counter())
                if job in self.done:
                    return
                # nobody else submits while the worker waits: the job's end follows from what is queued
                left_s = sum(w[0] for q in self.queues.values() for w in q) / 1e3
            time.sleep(max(left_s, 1e-4) / 2)


class H200Model(NullModel):
    """NullModel as Qwen3-TTS on the H200 (module docstring): its work goes on DeviceQueues."""

    steps_in_flight = 2
    decode_overlaps = True

    def __init__(self, max_slots: int, max_batch: int) -> None:
        super().__init__(max_slots, max_batch)
        # as Qwen3TTSModel with codec graphs of 24 and 48 frames: longer chunks for streams ahead
        self.info = dataclasses.replace(self.info, slack_chunk_frames=((2.0, 24), (6.0, 48)))
        self.codec_shapes: Counter[tuple[int, int]] = Counter()  # (rows bucket, frames) of each call
        self.codec_frames = 0  # frames decoded, padding not counted
        self.device = DeviceQueues()
        self.prefilled: set[int] = set()
        self.begun: dict[int, int] = {}
        self.decode_buckets = _default_buckets(max_batch)

    def open_slot(self, slot: int, params: StreamParams) -> None:
        super().open_slot(slot, params)
        self.begun[slot] = 0
        self.prefilled.discard(slot)

    def ready(self, slot: int) -> bool:
        return self._final.get(slot, False) and self._left.get(slot, 0) - self.begun.get(slot, 0) > 0

    def generate_start(self, slots: Sequence[int]) -> Callable[[], list[GenerateResult]]:
        new = [s for s in slots if s not in self.prefilled]
        for i in range(0, len(new), 32):
            b = bucket_for(len(new[i : i + 32]), (1, 2, 4, 8, 16, 32))
            self.device.submit("main", H200_PREFILL_MS[0] + H200_PREFILL_MS[1] * b, "prefill")
        self.prefilled.update(new)
        for s in slots:
            self.begun[s] += 1
        job = self.device.submit("main", _interp(H200_DECODE_MS, bucket_for(len(slots), self.decode_buckets)), "decode")

        def finish() -> list[GenerateResult]:
            self.device.wait(job)
            for s in slots:
                self.begun[s] -= 1
            return self.generate(slots)

        return finish

    def decode_start(self, work: Sequence[DecodeWork]) -> Queued[list[Decoded]]:
        frames = sorted((w.n_frames for w in work if w.n_frames), reverse=True)
        graphed, buckets = frame_ladder(48), powers_of_two(64)
        out = self.decode_timed(work)
        if not frames:
            return Queued.finished(out)
        job = -1
        for call in plan_codec_calls(frames, graphed, buckets):
            t = padded_frames(frames[call[0]], graphed)
            b = bucket_for(len(call), buckets)
            job = self.device.submit("codec", codec_call_ms(b, t), "codec")
            self.codec_shapes[(b, t)] += 1
            self.codec_frames += sum(frames[i] for i in call)
        return Queued(lambda: self.device.wait(job) or out, lambda: self.device.is_done(job))

    def close_slot(self, slot: int) -> None:
        super().close_slot(slot)
        self.begun.pop(slot, None)

    def device_wait_s(self) -> float:
        return self.device.wait_s


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


def run(args: argparse.Namespace) -> dict[str, Any]:
    model = (
        H200Model(args.max_slots, args.max_batch)
        if args.device == "h200"
        else NullModel(args.max_slots, args.max_batch, args.step_ms / 1e3, args.row_us / 1e6)
    )
    cfg = load_config(
        "null",
        args.max_slots,
        queue_ahead=not args.no_queue_ahead,
        max_decodes_in_flight=args.decodes_in_flight,
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
    ap.add_argument("--decodes-in-flight", type=int, default=1, help="EngineConfig.max_decodes_in_flight")
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
