"""A simulated H200 for the engine: Qwen3-TTS on CUDA as the engine sees it, on the CPU.

``H200Model`` is host_overhead.py's ``NullModel`` (frames for free, forced lengths) with the GPU's
timing: two frame steps in flight and the codec on a queue of its own (its urgent chunks on a
second one), taken once done, as Qwen3TTSModel on CUDA; each frame step, prefill and codec call waits as long as the H200's measured
graph of that shape (``H200_*``: the decode graph per batch bucket, the prefill per call, the codec
per (streams, frames) call, split as the served codec plan splits a tick's chunks). ``DeviceQueues``
runs that work on in-order queues that share the GPU when more than one runs (``SHARED_RATE``,
``URGENT_RATE``).
So the engine's scheduling can be tried at the GPU's speed before a device run measures it. The
model's own host work is not in it unless asked (``host_work``: the worker spins, holding the
interpreter lock as the real host work does, as long as the served model's calls took on the
H200's host, ``H200_HOST_MS``); any slowdown beyond the measured sharing is not in it.

    python3 benchmarks/host_overhead.py --device h200 --rate 200 --out h200_sim_cpu.json
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections import Counter
from collections.abc import Sequence

from null_model import NullModel

from voicewire.engine.model import Decoded, DecodeWork, GenerateResult, Queued, StreamParams
from voicewire.engine.qwen3 import CODEC_MAX_BATCH, CODEC_MAX_FRAMES_CUDA
from voicewire.engine.qwen3.codec_plan import padded_frames, plan_codec_calls
from voicewire.engine.qwen3.codec_runner import URGENT_FRAMES, URGENT_ROWS
from voicewire.engine.qwen3.cuda_graphs import bucket_for, frame_ladder, powers_of_two
from voicewire.engine.qwen3.model import SLACK_CHUNK_FRAMES, default_decode_buckets

# The served 1.7B engine's graphs on one H200 (bf16, ms): the decode graph per batch bucket
# (step_1.7b_h200.json, step_profile_large_batch_h200.json), the prefill of b prompts of 16 positions
# (2.41 ms for 8, 4.49 for 32), the codec per (streams, frames) call (codec_bench_h200.json
# [after.calls]; the shapes it did not time from codec_plan.py's fit of it).
H200_DECODE_MS = {1: 2.92, 64: 5.77, 128: 7.01, 256: 8.46, 512: 13.59}
H200_PREFILL_MS = (1.72, 0.0867)  # + per prompt
H200_CODEC_MS = {
    1: {1: 1.03, 2: 1.13, 4: 1.17, 12: 1.26, 24: 1.52, 48: 1.94},
    4: {1: 1.21, 2: 1.28, 4: 1.40, 12: 1.98, 24: 2.82, 48: 4.50},
    16: {1: 1.55, 2: 1.90, 4: 2.49, 12: 4.88, 24: 8.06, 48: 14.72},
    64: {1: 3.22, 2: 4.34, 4: 6.69, 12: 15.29, 24: 28.98, 48: 55.82},
}
# The served model's host time per call on the H200 (profile_serve_h200.json at 6bec6f9, 240 req/s,
# per tick: 0.93 ms launching a step, 1.1 ms recording the codes of its 158 rows on average, 1.34
# ms packing and launching its ~1.3 codec calls). ``open``: the ~2 ms a request that taking
# commands took there (4.45 ms a tick), where each open waited for the frame steps queued on the
# stream (one-element writes by index, since made fill_); 0 by default, to try what it does.
H200_HOST_MS = {"step": 0.93, "row": 0.007, "codec_call": 1.0, "open": 0.0}
# The decode graph at 256 rows beside a codec graph and a codec graph beside it: both chains at once
# take 96% of their time back to back (overlap_contention_h200.json), so each runs at ~0.52
SHARED_RATE = 0.52
# The codec's urgent lane (a stream of the highest priority) beside the others: not measured; taken
# as 0.7 of the GPU, the others sharing what is left of 2 x SHARED_RATE
URGENT_RATE = 0.7


def _interp(table: dict[int, float], x: float) -> float:
    """Piecewise linear in ``x``; past the last key in proportion to it."""
    keys = sorted(table)
    if x <= keys[0]:
        return table[keys[0]]
    for lo, hi in itertools.pairwise(keys):
        if x <= hi:
            return table[lo] + (x - lo) / (hi - lo) * (table[hi] - table[lo])
    return table[keys[-1]] * x / keys[-1]


def _spin(ms: float) -> None:
    """Host work on the calling thread: busy, holding the interpreter lock as Python does."""
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


def codec_call_ms(rows: int, frames: int) -> float:
    return _interp({b: _interp(row, frames) for b, row in H200_CODEC_MS.items()}, rows)


class DeviceQueues:
    """In-order device queues (the frame steps', the codec's, the codec's urgent lane) sharing one
    GPU: a piece of work starts when the one before it on its queue is done, runs at full speed
    alone, at SHARED_RATE while another queue runs too, and the urgent lane at URGENT_RATE beside
    the others, which share the rest. Advanced lazily to the wall clock whenever it is asked."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.queues: dict[str, list[list[float]]] = {"main": [], "codec": [], "urgent": []}  # [ms left alone, id]
        self.done: set[int] = set()
        self.t = time.perf_counter()
        self.ids = itertools.count()
        self.busy_s = {"main": 0.0, "codec": 0.0, "urgent": 0.0, "either": 0.0}
        self.wait_s = 0.0  # the worker blocked on the device (Model.device_wait_s)
        self.work_ms: dict[str, float] = {}  # each kind's work as timed alone, and its calls
        self.calls: dict[str, int] = {}

    def _advance(self, until: float) -> None:
        while self.t < until:
            active = [name for name, q in self.queues.items() if q]
            if not active:
                self.t = until
                return
            rates = self._rates(active)
            dt = min(until - self.t, min(self.queues[n][0][0] / 1e3 / rates[n] for n in active))
            for name in active:
                self.queues[name][0][0] -= dt * 1e3 * rates[name]
                self.busy_s[name] += dt
            self.busy_s["either"] += dt
            self.t += dt
            for q in self.queues.values():
                while q and q[0][0] <= 1e-9:
                    self.done.add(int(q.pop(0)[1]))

    @staticmethod
    def _rates(active: list[str]) -> dict[str, float]:
        if len(active) == 1:
            return {active[0]: 1.0}
        if "urgent" not in active:
            return dict.fromkeys(active, SHARED_RATE)
        rest = (2 * SHARED_RATE - URGENT_RATE) / (len(active) - 1)
        return {n: URGENT_RATE if n == "urgent" else rest for n in active}

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
    urgent_decode = True

    def __init__(self, max_slots: int, max_batch: int, host_work: dict[str, float] | None = None) -> None:
        super().__init__(max_slots, max_batch)
        self.host_ms = host_work or dict.fromkeys(H200_HOST_MS, 0.0)
        # as Qwen3TTSModel with its CUDA codec graphs: longer chunks for streams ahead
        self.info = dataclasses.replace(self.info, slack_chunk_frames=SLACK_CHUNK_FRAMES)
        self.codec_shapes: Counter[tuple[int, int]] = Counter()  # (rows bucket, frames) of each call
        self.codec_frames = 0  # frames decoded, padding not counted
        self.device = DeviceQueues()
        self.prefilled: set[int] = set()
        self.begun: dict[int, int] = {}
        self.decode_buckets = default_decode_buckets(max_batch)
        self.bulk_job: dict[int, int] = {}  # slot -> its last codec call on the bulk lane
        self.urgent_calls = 0

    def open_slot(self, slot: int, params: StreamParams) -> None:
        _spin(self.host_ms["open"])
        super().open_slot(slot, params)
        self.begun[slot] = 0
        self.prefilled.discard(slot)

    def ready(self, slot: int) -> bool:
        return self._final.get(slot, False) and self._left.get(slot, 0) - self.begun.get(slot, 0) > 0

    def generate_start(self, slots: Sequence[int]) -> Queued[list[GenerateResult]]:
        _spin(self.host_ms["step"])
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
            _spin(self.host_ms["row"] * len(slots))
            for s in slots:
                self.begun[s] -= 1
            return self.generate(slots)

        return Queued(finish, lambda: self.device.is_done(job))

    def decode_start(self, work: Sequence[DecodeWork], urgent: bool = False) -> Queued[list[Decoded]]:
        frames = sorted((w.n_frames for w in work if w.n_frames), reverse=True)
        graphed, buckets = frame_ladder(CODEC_MAX_FRAMES_CUDA), powers_of_two(CODEC_MAX_BATCH)
        out = self.decode_timed(work)
        if not frames:
            return Queued.finished(out)
        slots = [w.slot for w in work if w.n_frames]
        if (  # as CodecRunner._fits_urgent
            urgent
            and len(frames) <= URGENT_ROWS
            and frames[0] <= URGENT_FRAMES[-1]
            and all(s not in self.bulk_job or self.device.is_done(self.bulk_job[s]) for s in slots)
        ):
            t = padded_frames(frames[0], URGENT_FRAMES)
            b = bucket_for(len(frames), buckets)
            _spin(self.host_ms["codec_call"])
            job = self.device.submit("urgent", codec_call_ms(b, t), "codec")
            self.codec_shapes[(b, t)] += 1
            self.codec_frames += sum(frames)
            self.urgent_calls += 1
        else:
            for call in plan_codec_calls(frames, graphed, buckets):
                t = padded_frames(frames[call[0]], graphed)
                b = bucket_for(len(call), buckets)
                _spin(self.host_ms["codec_call"])
                job = self.device.submit("codec", codec_call_ms(b, t), "codec")
                self.codec_shapes[(b, t)] += 1
                self.codec_frames += sum(frames[i] for i in call)
            self.bulk_job.update((s, job) for s in slots)

        def wait() -> list[Decoded]:
            self.device.wait(job)
            return out

        return Queued(wait, lambda: self.device.is_done(job))

    def close_slot(self, slot: int) -> None:
        super().close_slot(slot)
        self.begun.pop(slot, None)
        self.bulk_job.pop(slot, None)

    def device_wait_s(self) -> float:
        return self.device.wait_s
