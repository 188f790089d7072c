"""The engine under load, in-process: requests from the committed length table, TTFP, underruns,
audio-s/s (serving_bench.py's ``serve`` section; see its docstring for what each figure means).

An open loop's ``audio_s_per_s`` is the audio that arrived during the arrivals' window over that
window: it counts the first seconds, when few streams have reached their listeners yet, and none of
what the window's last arrivals speak after it (the mix's long replies take seconds), so even an
engine that keeps up reads below what the rate asks, ``demand_audio_s_per_s`` (the requests' audio
over the window). ``audio_s_per_s_second_half`` counts only the window's second half, past the
ramp: the engine's steady output. Whether it kept up is what the refusals, completions and
underruns say.

Playback of each request is simulated from its first chunk with no extra buffer: a chunk that
arrives after the audio before it has played out stalls playback, which resumes when it arrives.
Each stall is listed (``stalls``: when, which chunk, how long) with the garbage collector's pauses
that overlapped its last 150 ms, and each open-loop point has the process's pauses (``gc``).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from voicewire.engine.config import EngineConfig, LevelConfig
from voicewire.engine.engine import Engine, EngineBusy
from voicewire.engine.heap import PAUSES
from voicewire.engine.model import StreamParams
from voicewire.engine.stream import Stream

LENGTHS = Path(__file__).resolve().parent / "data" / "utterance_lengths.json"
SR = 24_000
MIN_REQUESTS_PER_RATE = 20
STALLS_LISTED = 40
STALL_GC_LOOKBACK_S = 0.15  # a pause this long before a late chunk's due time can have made it late
WORDS = "the quick brown fox jumps over the lazy dog while the evening sun sets behind the hills".split()


def pct(xs: list[float], q: float) -> float | None:
    return float(np.percentile(xs, q)) if xs else None


def med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def load_config(model: str, max_streams: int, **overrides: Any) -> EngineConfig:
    """The engine config of these load runs: no lead-in trim (random weights make noise from the first
    sample), and an open past the slots is a rejection (no queue), as before the queue existed."""
    return EngineConfig(
        model=model,
        max_streams=max_streams,
        level=LevelConfig(onset_threshold_dbfs=-300.0, max_trim_ms=0.0),
        max_queued_streams=0,
        **overrides,
    )


class Lengths:
    def __init__(self, scale: float = 1.0) -> None:
        table = json.loads(LENGTHS.read_text())
        self.frames = [max(1, round(f * scale)) for f in table["frames"]]
        self.i = 0

    def next(self) -> int:
        f = self.frames[self.i % len(self.frames)]
        self.i += 1
        return f


async def one_request(
    engine: Engine, frames: int, seed: int, out: list[dict[str, Any]], words_per_s: float | None = None
) -> None:
    """One turn of ``frames`` frames; its text pushed at once, or a word a delta at ``words_per_s``
    (an LLM streaming its reply), while its audio is read."""
    words = [WORDS[i % len(WORDS)] for i in range(max(1, frames // 3))]
    t_submit = time.perf_counter()
    try:
        stream = engine.open_stream(StreamParams(forced_frames=frames, seed=seed))
    except EngineBusy:
        out.append({"rejected": True, "t_submit": t_submit, "frames": frames})
        return
    pushing = None
    if words_per_s:
        pushing = asyncio.create_task(_push_words(stream, words, words_per_s))
    else:
        stream.push_text(" ".join(words) + ".")
        stream.end()
    chunks: list[tuple[float, int]] = []
    error = None
    try:
        async for chunk in stream:
            if chunk.pcm.size:
                chunks.append((time.perf_counter(), chunk.pcm.size))
    except Exception as err:
        error = repr(err)
    if pushing is not None:
        pushing.cancel()
    t_done = time.perf_counter()
    m = stream.metrics
    rec: dict[str, Any] = {"frames": frames, "t_submit": t_submit, "t_done": t_done, "error": error}
    if chunks and m.t_first_text is not None:
        t0 = chunks[0][0]
        # playback from the first chunk, zero extra buffer; a late chunk stalls playback
        played_until = t0 + chunks[0][1] / SR
        stalls, stall_s, late_chunks, late = 0, 0.0, 0, []
        for i, (t_arr, n) in enumerate(chunks[1:], 1):
            if t_arr > played_until:
                stalls += 1
                late_chunks += 1
                stall_s += t_arr - played_until
                late.append((i, played_until, t_arr))
                played_until = t_arr
            played_until += n / SR
        audio_s = sum(n for _, n in chunks) / SR
        rec.update(
            ttfp_ms=(t0 - m.t_first_text) * 1e3,
            e2e_s=t_done - m.t_first_text,
            audio_s=audio_s,
            rtf=(chunks[-1][0] - m.t_first_text) / audio_s,
            chunks=len(chunks),
            late_chunks=late_chunks,
            stalls=stalls,
            stall_s=stall_s,
            late=late,
            arrivals=[(t, n) for t, n in chunks],
        )
    out.append(rec)


async def _push_words(stream: Stream, words: list[str], words_per_s: float) -> None:
    t_next = time.perf_counter()
    for i, word in enumerate(words):
        if stream.closed:
            return
        stream.push_text(word + ("." if i == len(words) - 1 else " "))
        t_next += 1.0 / words_per_s
        await asyncio.sleep(max(0.0, t_next - time.perf_counter()))
    stream.end()


def summarize(recs: list[dict[str, Any]], t_start: float, t_end: float) -> dict[str, Any]:
    ok = [r for r in recs if "ttfp_ms" in r]
    ttfp = [r["ttfp_ms"] for r in ok]

    def audio_s_per_s(t0: float) -> float:
        return sum(n for r in ok for t, n in r["arrivals"] if t0 <= t <= t_end) / SR / (t_end - t0)

    chunks = sum(r["chunks"] for r in ok)
    late = sum(r["late_chunks"] for r in ok)
    stalls = sorted((due, t_arr, i, r["frames"]) for r in ok for i, due, t_arr in r["late"])
    return {
        "requests": len(recs),
        "completed": len(ok),
        "rejected": sum(1 for r in recs if r.get("rejected")),
        "errors": sum(1 for r in recs if r.get("error")),
        "ttfp_ms_p50": med(ttfp),
        "ttfp_ms_p95": pct(ttfp, 95),
        "ttfp_ms_p99": pct(ttfp, 99),
        "ttfp_ms_max": max(ttfp) if ttfp else None,
        "e2e_s_p50": med([r["e2e_s"] for r in ok]),
        "rtf_p50": med([r["rtf"] for r in ok]),
        "rtf_p95": pct([r["rtf"] for r in ok], 95),
        "underrun_requests": sum(1 for r in ok if r["stalls"]),
        "request_on_time_rate": (sum(1 for r in ok if not r["stalls"]) / len(ok)) if ok else None,
        "chunk_on_time_rate": (1 - late / chunks) if chunks else None,
        "stall_s_total": sum(r["stall_s"] for r in ok),
        "audio_s_per_s": audio_s_per_s(t_start),
        # the window's second half: the streams have ramped up, so this is the engine's steady output
        "audio_s_per_s_second_half": audio_s_per_s((t_start + t_end) / 2),
        "stalls": [
            {
                "t_s": due - t_start,
                "chunk": i,
                "stall_ms": (t_arr - due) * 1e3,
                "frames": frames,
                "gc_ms": [
                    (p.generation, p.seconds * 1e3) for p in PAUSES.between(due - STALL_GC_LOOKBACK_S, t_arr)
                ],
            }
            for due, t_arr, i, frames in stalls[:STALLS_LISTED]
        ],
    }


def gc_pauses(before: tuple[list[int], list[float]], t0: float, t1: float) -> dict[str, Any]:
    """The process's collections since ``before`` (PAUSES' counts and seconds at t0), by generation:
    how many, their total and the longest between t0 and t1."""
    out: dict[str, Any] = {}
    for g in range(3):
        ms = [p.seconds * 1e3 for p in PAUSES.between(t0, t1) if p.generation == g]
        out[str(g)] = {
            "n": PAUSES.count[g] - before[0][g],
            "total_ms": (PAUSES.seconds[g] - before[1][g]) * 1e3,
            "max_ms": max(ms, default=0.0),
        }
    return out


def engine_delta(engine: Engine, before: dict[str, Any]) -> dict[str, Any]:
    st = engine.stats
    hist = {k: v - before["hist"].get(k, 0) for k, v in st.batch_sizes.items()}
    steps = st.steps - before["steps"]
    busy_s = st.generate_s + st.decode_s - before["generate_s"] - before["decode_s"]
    wait_s = st.device_wait_s - before["device_wait_s"]
    commands, commands_s = st.commands - before["commands"], st.commands_s - before["commands_s"]
    return {
        "steps": steps,
        "generate_s": st.generate_s - before["generate_s"],
        "decode_s": st.decode_s - before["decode_s"],
        "device_wait_s": wait_s,
        # the worker's own time a step: the step less its waits for the device
        "host_ms_per_step": (busy_s - wait_s) / steps * 1e3 if steps else None,
        # stream commands (opens, text, ends, cancels): the worker's time in them, in steps or between
        "commands": commands,
        "commands_s": commands_s,
        "us_per_command": commands_s / commands * 1e6 if commands else None,
        "batch_hist": {str(k): v for k, v in sorted(hist.items()) if v},
    }


def engine_snapshot(engine: Engine) -> dict[str, Any]:
    st = engine.stats
    return {
        "steps": st.steps,
        "generate_s": st.generate_s,
        "decode_s": st.decode_s,
        "device_wait_s": st.device_wait_s,
        "commands": st.commands,
        "commands_s": st.commands_s,
        "hist": dict(st.batch_sizes),
    }


async def open_loop(
    engine: Engine, rate: float, duration_s: float, lengths: Lengths, seed: int, words_per_s: float | None = None
) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    recs: list[dict[str, Any]] = []
    tasks = []
    before = engine_snapshot(engine)
    gc_before = (list(PAUSES.count), list(PAUSES.seconds))
    t_start = time.perf_counter()
    t_next = t_start
    lag = []
    i = 0
    duration_s = max(duration_s, MIN_REQUESTS_PER_RATE / rate)  # enough requests for a p95
    while t_next < t_start + duration_s:
        now = time.perf_counter()
        if t_next > now:
            await asyncio.sleep(t_next - now)
        lag.append(time.perf_counter() - t_next)
        tasks.append(
            asyncio.create_task(one_request(engine, lengths.next(), seed * 100_000 + i, recs, words_per_s))
        )
        i += 1
        t_next += rng.exponential(1.0 / rate)
    t_end = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=120)
    out = summarize(recs, t_start, t_end)
    out["gc"] = gc_pauses(gc_before, t_start, time.perf_counter())
    asked = sum(r["frames"] for r in recs) * engine.info.frame_samples / engine.info.sample_rate_hz
    out.update(
        rate=rate,
        duration_s=duration_s,
        arrival_lag_ms_p99=pct([x * 1e3 for x in lag], 99),
        demand_audio_s_per_s=asked / (t_end - t_start),
    )
    out["engine"] = engine_delta(engine, before)
    return out


async def closed_loop(
    engine: Engine, conc: int, duration_s: float, lengths: Lengths, seed: int, words_per_s: float | None = None
) -> dict[str, Any]:
    recs: list[dict[str, Any]] = []
    before = engine_snapshot(engine)
    t_start = time.perf_counter()
    t_stop = t_start + duration_s

    async def client(c: int) -> None:
        j = 0
        while time.perf_counter() < t_stop:
            await one_request(engine, lengths.next(), seed * 100_000 + c * 1000 + j, recs, words_per_s)
            j += 1

    await asyncio.wait_for(asyncio.gather(*(client(c) for c in range(conc))), timeout=duration_s + 120)
    out = summarize(recs, t_start, t_stop)
    out.update(concurrency=conc, duration_s=duration_s)
    out["engine"] = engine_delta(engine, before)
    return out


async def burst(engine: Engine, n: int, frames: int, seed: int) -> dict[str, Any]:
    """n requests of ``frames`` frames at once, the official package's batched generate as a workload:
    aggregate audio-s/s from the first submission to the last chunk (codec and streaming included)."""
    recs: list[dict[str, Any]] = []
    before = engine_snapshot(engine)
    t_start = time.perf_counter()
    requests = (one_request(engine, frames, seed * 100_000 + i, recs) for i in range(n))
    await asyncio.wait_for(asyncio.gather(*requests), timeout=300)
    t_end = max(r["t_done"] for r in recs)
    out = summarize(recs, t_start, t_end)
    out.update(requests_at_once=n, frames=frames, wall_s=t_end - t_start)
    out["engine"] = engine_delta(engine, before)
    return out
