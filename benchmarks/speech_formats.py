"""First-byte latency of ``POST /v1/audio/speech`` per response format, through a real
``voicewire serve`` (the embedded voice) on this machine.

    .venv/bin/python benchmarks/speech_formats.py            # -> benchmarks/results/speech_formats_cpu.json

The server answers once the first audio chunk is out of the engine, so the encoders' share is what
a format adds to pcm's first byte: an MP3 or Ogg header and the first encoded frame. Requests run
one at a time, the formats in turn (round-robin, so a drift of the machine hits every format
alike); each reports the time from the request's send to its first body byte and to its last.
The acceptance: the median first byte of mp3 and opus within ``BUDGET_MS`` of pcm's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

FORMATS = ("pcm", "mp3", "opus", "aac", "flac", "wav", "mulaw")
BUDGET_MS = 20.0  # mp3 / opus first byte over pcm's, median
TEXT = "Thanks for calling. Your order number is 4521, and it will arrive on Friday."
READY_TIMEOUT_S = 120.0
REQUEST_TIMEOUT_S = 60.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _wait_ready(http: aiohttp.ClientSession, base: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            async with http.get(f"{base}/readyz") as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.2)
    raise TimeoutError(f"the server at {base} was not ready within {READY_TIMEOUT_S:g} s")


async def _one(http: aiohttp.ClientSession, base: str, fmt: str) -> tuple[float, float, int]:
    """(first body byte ms, last byte ms, bytes) of one request."""
    body = {"input": TEXT, "voice": "alloy", "response_format": fmt, "seed": 1}
    t0 = time.perf_counter()
    first_ms = None
    size = 0
    async with http.post(f"{base}/v1/audio/speech", json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{fmt}: HTTP {resp.status} {(await resp.read())[:200]!r}")
        async for chunk in resp.content.iter_any():
            if first_ms is None and chunk:
                first_ms = (time.perf_counter() - t0) * 1000
            size += len(chunk)
    assert first_ms is not None
    return first_ms, (time.perf_counter() - t0) * 1000, size


def _summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median": round(statistics.median(ordered), 2),
        "p90": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 2),
        "min": round(ordered[0], 2),
    }


async def measure(base: str, rounds: int, warmup: int) -> dict[str, Any]:
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        await _wait_ready(http, base)
        for _ in range(warmup):
            for fmt in FORMATS:
                await _one(http, base, fmt)
        first: dict[str, list[float]] = {f: [] for f in FORMATS}
        last: dict[str, list[float]] = {f: [] for f in FORMATS}
        sizes: dict[str, int] = {}
        for _ in range(rounds):
            for fmt in FORMATS:
                f_ms, l_ms, size = await _one(http, base, fmt)
                first[fmt].append(f_ms)
                last[fmt].append(l_ms)
                sizes[fmt] = size
    pcm_first = statistics.median(first["pcm"])
    per_format = {
        fmt: {
            "first_byte_ms": _summary(first[fmt]),
            "last_byte_ms": _summary(last[fmt]),
            "first_byte_over_pcm_ms": round(statistics.median(first[fmt]) - pcm_first, 2),
            "bytes": sizes[fmt],
        }
        for fmt in FORMATS
    }
    passed = all(per_format[f]["first_byte_over_pcm_ms"] <= BUDGET_MS for f in ("mp3", "opus"))
    return {
        "what": "POST /v1/audio/speech first body byte per response_format, one request at a time",
        "text": TEXT,
        "rounds": rounds,
        "acceptance": {"mp3_and_opus_first_byte_within_ms_of_pcm": BUDGET_MS, "passed": passed},
        "formats": per_format,
    }


def _meta(started_s: float) -> dict[str, Any]:
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    dirty = "+uncommitted" if git("status", "--porcelain", "--untracked-files=no") else ""
    return {
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "commit": (git("rev-parse", "--short", "HEAD") or "unknown") + dirty,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "seconds": round(time.monotonic() - started_s),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=20, help="requests per format")
    ap.add_argument("--warmup", type=int, default=2, help="rounds not counted")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/speech_formats_cpu.json"))
    ap.add_argument("--voicewire", default=str(Path(sys.executable).with_name("voicewire")))
    args = ap.parse_args()
    started_s = time.monotonic()
    port = _free_port()
    server = subprocess.Popen(
        [args.voicewire, "serve", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        result = asyncio.run(measure(f"http://127.0.0.1:{port}", args.rounds, args.warmup))
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
    out = {"meta": _meta(started_s), **result}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    for fmt, row in result["formats"].items():
        print(
            f"{fmt:6} first byte {row['first_byte_ms']['median']:7.1f} ms"
            f" ({row['first_byte_over_pcm_ms']:+6.1f} vs pcm), last {row['last_byte_ms']['median']:7.1f} ms,"
            f" {row['bytes']} bytes"
        )
    print("acceptance:", result["acceptance"])


if __name__ == "__main__":
    main()
