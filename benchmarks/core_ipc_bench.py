"""What the engine-core boundary costs: per chunk, and in TTFP, on this machine.

(a) The boundary alone, with the real wire format and the real socket setup of ``CoreClient``
    (a plain PUSH socket with NOBLOCK sends towards the core, a zmq.asyncio PULL back) against an
    echo core in another process that answers a message with an ``Audio`` chunk:
    - latency: one command out, one chunk back, delivered into a ``Stream`` and taken from its
      iterator, one at a time (round trip; a chunk's one-way cost is about half of it);
    - throughput: a burst of chunks back to back; CPU seconds per chunk on each side.
(b) Engine TTFP of the embedded voice (first text -> first audio on the caller's loop, the
    engine's own ``StreamMetrics``) in process (``Engine``) and through one core (``CoreClient``),
    whole sentences, one stream at a time and 10 at once.
(c) Through the front door: ``voicewire serve --replicas 0`` (engine in the gateway's process)
    and ``--replicas 1`` (one core), N WebRTC peers with words streamed at 20/s, the p99 audio
    packet inter-arrival gap per turn (benchmarks/webrtc_ttfa.py's scenario, unchanged).

    python benchmarks/core_ipc_bench.py --out benchmarks/results/core_ipc_cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

import numpy as np
import zmq
import zmq.asyncio
from ws_bench import SENTENCES, summary_ms, write_results

from voicewire.engine import AudioChunk, Engine, EngineConfig, Stream
from voicewire.engine.commands import PushText
from voicewire.engine.core import CoreClient
from voicewire.engine.core.messages import (
    Audio,
    decode_from_core,
    decode_to_core,
    encode_from_core,
    encode_to_core,
)

RATE_HZ = 24_000
CHUNK_SAMPLES = (300 * 12, 1920)  # the embedded voice's steady chunk (12 frames); one Qwen3 frame


def echo_core(to_core: str, from_core: str) -> None:
    """The far side: PushText(n) -> one Audio chunk of n samples; PushText(-k) -> k chunks of 1920
    samples back to back, then its own CPU seconds in a final chunk's text; anything else: exit."""
    ctx = zmq.Context()
    inp, out = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    for s in (inp, out):
        s.setsockopt(zmq.SNDHWM, 0)
        s.setsockopt(zmq.RCVHWM, 0)
    inp.connect(to_core)
    out.connect(from_core)
    pcm = {n: np.random.default_rng(0).uniform(-1, 1, n).astype(np.float32) for n in (*CHUNK_SAMPLES, 1)}
    while True:
        msg = decode_to_core(inp.recv_multipart())
        if not isinstance(msg, PushText) or not msg.delta.lstrip("-").isdigit():
            break
        n = int(msg.delta)
        if n > 0:
            out.send_multipart(encode_from_core(Audio(msg.stream_id, AudioChunk(pcm[n], RATE_HZ, 0), 0)))
            continue
        cpu0 = time.process_time()
        for i in range(-n):
            out.send_multipart(encode_from_core(Audio(msg.stream_id, AudioChunk(pcm[1920], RATE_HZ, i * 1920), 0)))
        text = f"{time.process_time() - cpu0:.6f}"
        out.send_multipart(encode_from_core(Audio(msg.stream_id, AudioChunk(pcm[1], RATE_HZ, 0, text=text), 0)))


async def boundary(args: argparse.Namespace) -> dict[str, Any]:
    tmp = tempfile.mkdtemp(prefix="voicewire-bench-")
    to_addr, from_addr = f"ipc://{tmp}/to", f"ipc://{tmp}/from"
    actx = zmq.asyncio.Context()
    push = zmq.Context.shadow(actx.underlying).socket(zmq.PUSH)
    pull = actx.socket(zmq.PULL)
    for s in (push, pull):
        s.setsockopt(zmq.SNDHWM, 0)
        s.setsockopt(zmq.RCVHWM, 0)
    push.bind(to_addr)
    pull.bind(from_addr)
    child = multiprocessing.get_context("spawn").Process(target=echo_core, args=(to_addr, from_addr))
    child.start()
    loop = asyncio.get_running_loop()
    stream = Stream(1, loop, lambda cmd: None)
    taken = aiter(stream)

    async def one(n: int) -> float:
        t0 = time.perf_counter()
        push.send_multipart(encode_to_core(PushText(1, str(n))), flags=zmq.NOBLOCK)
        msg = decode_from_core(await pull.recv_multipart())
        assert isinstance(msg, Audio)
        stream.deliver(msg.chunk)
        await anext(taken)
        return time.perf_counter() - t0

    out: dict[str, Any] = {}
    while True:  # until the echo core has connected (NOBLOCK refuses a send with no peer)
        try:
            await one(CHUNK_SAMPLES[0])
            break
        except zmq.Again:
            await asyncio.sleep(0.05)
    for n in CHUNK_SAMPLES:
        for _ in range(200):
            await one(n)
        rtts = [await one(n) for _ in range(args.pings)]
        us = sorted(r * 1e6 for r in rtts)
        out[f"round_trip_{n}_samples"] = {
            "n": len(us),
            "p50_us": round(us[len(us) // 2], 1),
            "p99_us": round(us[int(len(us) * 0.99)], 1),
            "mean_us": round(statistics.fmean(us), 1),
            "one_way_estimate_p50_us": round(us[len(us) // 2] / 2, 1),
        }
    # Throughput: the gateway side's CPU per chunk (receive, decode, deliver, take).
    k = args.burst
    cpu0, t0 = time.process_time(), time.perf_counter()
    push.send_multipart(encode_to_core(PushText(1, str(-k))), flags=zmq.NOBLOCK)
    far_cpu_s = 0.0
    for _ in range(k + 1):
        msg = decode_from_core(await pull.recv_multipart())
        assert isinstance(msg, Audio)
        stream.deliver(msg.chunk)
        chunk = await anext(taken)
        if chunk.text:
            far_cpu_s = float(chunk.text)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    out["burst_1920_samples"] = {
        "chunks": k,
        "chunks_per_s": round(k / wall),
        "gateway_side_cpu_us_per_chunk": round(cpu / k * 1e6, 1),
        "core_side_cpu_us_per_chunk": round(far_cpu_s / k * 1e6, 1),
        "note": "a chunk of 80 ms of 24 kHz audio; a stream makes 12.5 of them per second",
    }
    push.send_multipart(encode_to_core(PushText(1, "stop")))
    child.join(5)
    push.close(linger=0)
    pull.close(linger=0)
    actx.term()
    return out


async def ttfp(engine: Engine | CoreClient, turns: int, concurrent: int) -> list[float]:
    async def turn(text: str) -> float:
        stream = engine.open_stream()
        stream.push_text(text)
        stream.end()
        async for _ in stream:
            pass
        assert stream.metrics.ttfp_s is not None
        return stream.metrics.ttfp_s

    out: list[float] = []
    for i in range(0, turns, concurrent):
        batch = [SENTENCES[(i + j) % len(SENTENCES)] for j in range(concurrent)]
        out += await asyncio.gather(*(turn(t) for t in batch))
    return out


async def engine_ttfp(args: argparse.Namespace) -> dict[str, Any]:
    """Both engines up at once, measured in alternating rounds: a shared machine's load drifts,
    and alternation spreads the drift over both."""
    got: dict[str, list[float]] = {}
    async with Engine(EngineConfig()) as local, CoreClient(EngineConfig()) as core:
        engines: dict[str, Engine | CoreClient] = {"in_process": local, "core": core}
        for engine in engines.values():
            await ttfp(engine, 6, 1)  # warm
        for _ in range(args.rounds):
            for concurrent in (1, 10):
                for name, engine in engines.items():
                    key = f"{name}_{concurrent}_streams"
                    got.setdefault(key, []).extend(await ttfp(engine, args.turns // args.rounds, concurrent))
    return {key: summary_ms(values) for key, values in got.items()}


def start_server(port: int, replicas: int) -> subprocess.Popen[bytes]:
    """``voicewire serve --replicas N`` as a user starts it; returns once /readyz is 200."""
    cmd = [sys.executable, "-m", "voicewire.realtime.cli", "serve", "--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen([*cmd, "--replicas", str(replicas)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("server did not start")


async def webrtc_gaps(args: argparse.Namespace) -> list[dict[str, Any]]:
    """(c) The gateway in front: webrtc_ttfa's scenario (N aiortc peers, words streamed at 20/s),
    the engine in the gateway's process (--replicas 0) and in one core (--replicas 1), alternating."""
    import webrtc_ttfa

    rows = []
    for _ in range(args.rounds):
        for replicas in (0, 1):
            server = start_server(args.port, replicas)
            try:
                url = f"http://127.0.0.1:{args.port}"
                cpu = webrtc_ttfa.CpuMeter(server.pid)  # counts the gateway process only
                await webrtc_ttfa.scenario(url, 2, 2, "whole", 20.0, cpu)  # warm-up
                turns = max(3, args.webrtc_turns // args.webrtc_peers + 1)
                row = await webrtc_ttfa.scenario(url, args.webrtc_peers, turns, "stream", 20.0, cpu)
                rows.append({"replicas": replicas, "loadavg_1m": round(os.getloadavg()[0], 2), **row})
            finally:
                server.terminate()
                server.wait(20)
    return rows


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"boundary": await boundary(args)}
    print(results["boundary"], flush=True)
    results["engine_ttfp"] = await engine_ttfp(args)
    print(results["engine_ttfp"], flush=True)
    if args.webrtc_peers:
        results["webrtc_stream_words_20_per_s"] = await webrtc_gaps(args)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results/core_ipc_cpu.json")
    ap.add_argument("--pings", type=int, default=2000)
    ap.add_argument("--burst", type=int, default=20_000)
    ap.add_argument("--turns", type=int, default=60, help="engine TTFP turns per engine and concurrency")
    ap.add_argument("--rounds", type=int, default=3, help="alternations of the in-process and core runs")
    ap.add_argument("--webrtc-peers", type=int, default=10, help="0: skip the gateway part")
    ap.add_argument("--webrtc-turns", type=int, default=40)
    ap.add_argument("--port", type=int, default=8767)
    args = ap.parse_args()
    t0 = time.monotonic()
    results = asyncio.run(main_async(args))
    git = ["git", "-C", os.path.dirname(os.path.abspath(__file__))]
    commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    results["commit"] = commit + ("+uncommitted" if dirty.stdout.strip() else "")
    results["secs"] = round(time.monotonic() - t0, 1)
    results["max_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    write_results(results, args.out, note="2 cores shared with other work; loadavg recorded per row")


if __name__ == "__main__":
    main()
