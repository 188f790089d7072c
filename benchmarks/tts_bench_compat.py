"""What the Nari Labs ``tts_bench`` harness sees of our server: its OpenAI-speech requests, its
audible-TTFA rule, written here from its published contract (nari-labs/benchmarks, tts_bench/src:
targets.py, audio.py, runtime.py, metrics.py), not copied.

    python -m benchmarks.tts_bench_compat --base-url http://127.0.0.1:8080 --requests 10
    python -m benchmarks.tts_bench_compat --base-url http://127.0.0.1:8080 --rate 300 --duration-s 10 --out r.json

The first sends one request at a time (the server alone); the second is the harness's own load, open
loop: Poisson arrivals at ``--rate`` for ``--duration-s``, from ``--procs`` client processes (one
Python loop cannot read hundreds of streams at once and keep its clock honest) and ``--clients``
loopback addresses (many users, as the server's per-client quotas expect them).

Per request, as the harness does it:

- preflight: ``GET /health`` must be 2xx;
- ``POST /v1/audio/speech`` with its canonical body (``model``, ``input``, ``voice: "Ryan"``,
  ``language: "English"``, ``stream: true``, ``non_streaming_mode: false``) and the target's
  contract: ``response_format: "pcm"``; the vLLM-Omni target adds ``stream_format: "audio"``,
  the SGLang-Omni target requires an ``X-Sample-Rate`` header equal to the rate it expects
  (24000); the content type must be raw PCM (``audio/pcm`` and kin);
- the clock starts when the first body chunk is on the wire (aiohttp's request-chunk trace);
- the body is read as it arrives, cut to whole 16-bit samples;
- audible onset: 20 ms windows every 10 ms, each with its mean removed, RMS at or above -45 dBFS,
  two windows in a row; the onset is the first of the two;
- playback starts at the first audio and runs in real time, stalling when the next audio is late;
  audible TTFA = when the onset plays, minus the start.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np

EXPECTED_RATE_HZ = 24_000
MODEL = "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice"  # the harness's default --model
VOICE = "Ryan"  # ...--voice
LANGUAGE = "English"  # ...--language
PCM_CONTENT_TYPES = frozenset({"audio/pcm", "audio/l16", "application/octet-stream", "audio/raw"})
TARGETS = ("sglang-omni", "vllm-omni")

ONSET_WINDOW_MS = 20
ONSET_HOP_MS = 10
ONSET_DBFS = -45.0
ONSET_RUN = 2  # windows in a row above the level


@dataclass
class Result:
    text: str
    status: int = 0
    content_type: str = ""
    sample_rate_header: str | None = None
    error: str = ""
    ttfb_ms: float | None = None
    audible_ttfa_ms: float | None = None
    audio_ms: float = 0.0
    stall_ms: float = 0.0
    arrivals: list[tuple[float, int]] = field(default_factory=list)  # (s since start, samples)


def speech_body(text: str, target: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "input": text,
        "voice": VOICE,
        "language": LANGUAGE,
        "stream": True,
        "non_streaming_mode": False,
        "response_format": "pcm",
    }
    if target == "vllm-omni":
        body["stream_format"] = "audio"
    return body


def onset_sample(pcm: np.ndarray, rate_hz: int) -> int | None:
    """The harness's audible onset in int16 ``pcm``: start of the first of ``ONSET_RUN`` windows
    in a row whose mean-removed RMS reaches ``ONSET_DBFS``."""
    win, hop = round(rate_hz * ONSET_WINDOW_MS / 1000), round(rate_hz * ONSET_HOP_MS / 1000)
    if pcm.size < win:
        return None
    x = np.lib.stride_tricks.sliding_window_view(pcm.astype(np.float64) / 32768.0, win)[::hop]
    loud = x.std(axis=1) >= 10 ** (ONSET_DBFS / 20)  # std: the RMS with each window's mean removed
    runs = np.convolve(loud, np.ones(ONSET_RUN, dtype=int), "valid") == ONSET_RUN
    first = np.flatnonzero(runs)
    return int(first[0]) * hop if first.size else None


def audible_time_s(arrivals: list[tuple[float, int]], onset: int, rate_hz: int) -> float | None:
    """When the onset sample plays for a listener who starts at the first audio and stalls when
    audio is late (times in seconds since the request started)."""
    clock, played = arrivals[0][0], 0
    for t, n in arrivals:
        clock = max(clock, t)  # late audio: playback waited for it
        if played <= onset < played + n:
            return clock + (onset - played) / rate_hz
        clock += n / rate_hz
        played += n
    return None


class _Start:
    """Per request: when its first body chunk was sent (filled by the session's trace)."""

    def __init__(self) -> None:
        self.t: float | None = None


def _trace() -> aiohttp.TraceConfig:
    async def on_chunk_sent(session: Any, ctx: Any, params: Any) -> None:
        start = ctx.trace_request_ctx
        if isinstance(start, _Start) and start.t is None:
            start.t = time.perf_counter()

    trace = aiohttp.TraceConfig()
    trace.on_request_chunk_sent.append(on_chunk_sent)
    return trace


async def run_request(http: aiohttp.ClientSession, base_url: str, text: str, target: str) -> Result:
    res = Result(text)
    start = _Start()
    pending = bytearray()
    pcm_parts: list[np.ndarray] = []
    try:
        async with http.post(
            f"{base_url}/v1/audio/speech",
            json=speech_body(text, target),
            headers={"Accept": "audio/wav, audio/pcm, application/octet-stream"},
            trace_request_ctx=start,
        ) as resp:
            res.status = resp.status
            res.content_type = resp.headers.get("Content-Type", "").split(";")[0].strip().lower()
            res.sample_rate_header = resp.headers.get("X-Sample-Rate")
            if resp.status != 200:
                res.error = f"HTTP {resp.status}: {(await resp.read())[:300]!r}"
                return res
            if res.content_type not in PCM_CONTENT_TYPES:
                res.error = f"content type {res.content_type!r} is not raw PCM"
                return res
            if target == "sglang-omni" and res.sample_rate_header != str(EXPECTED_RATE_HZ):
                res.error = f"X-Sample-Rate {res.sample_rate_header!r}, expected {EXPECTED_RATE_HZ}"
                return res
            async for data in resp.content.iter_any():
                now = time.perf_counter()
                pending += data
                whole = len(pending) - len(pending) % 2
                if not whole:
                    continue
                pcm = np.frombuffer(bytes(pending[:whole]), "<i2")
                del pending[:whole]
                assert start.t is not None  # the body went out before any answer came
                t0 = start.t
                if res.ttfb_ms is None:
                    res.ttfb_ms = (now - t0) * 1000
                res.arrivals.append((now - t0, pcm.size))
                pcm_parts.append(pcm)
    except (aiohttp.ClientError, TimeoutError) as err:
        res.error = f"{type(err).__name__}: {err}"
        return res
    if pending:
        res.error = "the audio ended with half a sample"
        return res
    if not pcm_parts:
        res.error = "no audio"
        return res
    pcm = np.concatenate(pcm_parts)
    res.audio_ms = pcm.size / EXPECTED_RATE_HZ * 1000
    clock = res.arrivals[0][0]
    for t, n in res.arrivals:
        res.stall_ms += max(0.0, t - clock) * 1000
        clock = max(clock, t) + n / EXPECTED_RATE_HZ
    onset = onset_sample(pcm, EXPECTED_RATE_HZ)
    if onset is not None:
        heard = audible_time_s(res.arrivals, onset, EXPECTED_RATE_HZ)
        res.audible_ttfa_ms = None if heard is None else heard * 1000
    return res


async def run(base_url: str, texts: list[str], target: str = "sglang-omni") -> list[Result]:
    """Preflight, then one request at a time (the harness's rate is open loop; one at a time
    measures the server alone, which is what a comparison with the probe needs)."""
    base_url = base_url.rstrip("/")
    # The harness's session: one per run, keep-alive connections, its own trace per request.
    async with aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=120), trace_configs=[_trace()], headers={"Accept-Encoding": "identity"}
    ) as http:
        async with http.get(f"{base_url}/health") as resp:
            await resp.read()
            if not 200 <= resp.status < 300:
                raise RuntimeError(f"healthcheck returned HTTP {resp.status}")
        return [await run_request(http, base_url, text, target) for text in texts]


async def open_loop(
    base_url: str, texts: list[str], rate: float, duration_s: float, target: str, addresses: list[str], start_at: float, seed: int
) -> list[Result]:
    """Poisson arrivals at ``rate`` from ``start_at`` (time.time()) for ``duration_s``, each request on
    its own task, the sessions' local addresses taken in turn."""
    base_url = base_url.rstrip("/")
    rng = np.random.default_rng(seed)
    arrivals, t = [], float(rng.exponential(1 / rate))
    while t < duration_s:
        arrivals.append(t)
        t += float(rng.exponential(1 / rate))
    timeout = aiohttp.ClientTimeout(total=120)
    sessions = [
        aiohttp.ClientSession(
            timeout=timeout,
            trace_configs=[_trace()],
            headers={"Accept-Encoding": "identity"},
            connector=aiohttp.TCPConnector(limit=0, local_addr=(addr, 0)),
        )
        for addr in addresses
    ]
    try:
        await asyncio.sleep(max(0.0, start_at - time.time()))
        t0 = time.perf_counter()
        tasks = []
        for i, at in enumerate(arrivals):
            await asyncio.sleep(max(0.0, at - (time.perf_counter() - t0)))
            http = sessions[i % len(sessions)]
            tasks.append(asyncio.create_task(run_request(http, base_url, texts[i % len(texts)], target)))
        return list(await asyncio.gather(*tasks))
    finally:
        await asyncio.gather(*(s.close() for s in sessions))


def _open_loop_proc(args: tuple[Any, ...]) -> list[dict[str, Any]]:
    results = asyncio.run(open_loop(*args))
    return [{k: v for k, v in r.__dict__.items() if k != "arrivals"} for r in results]


def _pct(xs: list[float], q: float) -> float | None:
    return round(float(np.percentile(xs, q)), 1) if xs else None


def summarize(rows: list[dict[str, Any]], rate: float, duration_s: float) -> dict[str, Any]:
    """The open loop's figures: refused (an HTTP status other than 200, by status), failed (anything
    else), time to first byte and audible TTFA of the requests served, and those whose playback
    stalled (the harness's playback: from the first audio, in real time)."""
    ok = [r for r in rows if not r["error"]]
    refused: dict[str, int] = {}
    for r in rows:
        if r["status"] not in (0, 200):
            refused[str(r["status"])] = refused.get(str(r["status"]), 0) + 1
    ttfb = [r["ttfb_ms"] for r in ok if r["ttfb_ms"] is not None]
    ttfa = [r["audible_ttfa_ms"] for r in ok if r["audible_ttfa_ms"] is not None]
    return {
        "rate": rate,
        "duration_s": duration_s,
        "requests": len(rows),
        "served": len(ok),
        "refused": sum(refused.values()),
        "refused_by_status": refused,
        "failed": len(rows) - len(ok) - sum(refused.values()),
        "errors": sorted({r["error"][:120] for r in rows if r["error"]})[:5],
        "ttfb_ms": {"p50": _pct(ttfb, 50), "p95": _pct(ttfb, 95), "p99": _pct(ttfb, 99)},
        "audible_ttfa_ms": {"p50": _pct(ttfa, 50), "p95": _pct(ttfa, 95), "p99": _pct(ttfa, 99)},
        "no_onset": len(ok) - len(ttfa),
        "stalled": sum(r["stall_ms"] > 0 for r in ok),
        "stall_ms_max": round(max((r["stall_ms"] for r in ok), default=0.0), 1),
        "audio_s": round(sum(r["audio_ms"] for r in ok) / 1000, 1),
    }


def main(argv: list[str] | None = None) -> int:
    from voicewire.realtime.client.probe_turn import TURNS_PER_PROC
    from voicewire.realtime.client.simulated_llm import TEXTS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8080")
    p.add_argument("--target", choices=TARGETS, default="sglang-omni")
    p.add_argument("--requests", type=int, default=len(TEXTS))
    p.add_argument("--rate", type=float, default=0.0, help="requests/s, open loop (0: one at a time)")
    p.add_argument("--duration-s", type=float, default=10.0)
    p.add_argument(
        "--procs", type=int, default=0, help=f"client processes of the open loop (0: one per {TURNS_PER_PROC:g} requests/s)"
    )
    p.add_argument("--clients", type=int, default=64, help="loopback addresses the open loop comes from")
    p.add_argument("--seed", type=int, default=0, help="the open loop's draw of arrival times")
    p.add_argument("--out", default="", help="the open loop's summary and requests (JSON)")
    args = p.parse_args(argv)
    if args.rate > 0:
        return _main_open_loop(args, list(TEXTS))
    texts = [TEXTS[i % len(TEXTS)] for i in range(args.requests)]
    results = asyncio.run(run(args.base_url, texts, args.target))
    for r in results:
        row = {k: v for k, v in r.__dict__.items() if k != "arrivals"}
        print(json.dumps(row))
    ok = [r.audible_ttfa_ms for r in results if not r.error and r.audible_ttfa_ms is not None]
    if ok:
        print(f"audible TTFA p50 {statistics.median(ok):.1f} ms over {len(ok)} requests", file=sys.stderr)
    return 0 if len(ok) == len(results) else 1


def _main_open_loop(args: argparse.Namespace, texts: list[str]) -> int:
    from concurrent.futures import ProcessPoolExecutor

    asyncio.run(run(args.base_url, [], args.target))  # the harness's preflight: GET /health
    addresses = [f"127.0.0.{2 + i}" for i in range(args.clients)]
    from voicewire.realtime.client.probe_turn import TURNS_PER_PROC

    auto = min(math.ceil(args.rate / TURNS_PER_PROC), os.cpu_count() or 1)
    procs = max(1, min(args.procs or auto, args.clients))
    start_at = time.time() + 1.0  # every process begins at once
    jobs = [
        (args.base_url, texts[k:] + texts[:k], args.rate / procs, args.duration_s, args.target,
         addresses[k::procs], start_at, args.seed * procs + k)
        for k in range(procs)
    ]  # fmt: skip
    with ProcessPoolExecutor(procs) as pool:
        rows = [row for part in pool.map(_open_loop_proc, jobs) for row in part]
    summary = summarize(rows, args.rate, args.duration_s)
    print(json.dumps(summary))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"summary": summary, "requests": rows}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
