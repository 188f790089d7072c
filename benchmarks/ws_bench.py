"""Gateway benchmark over the WebSocket (protocol v1) with the embedded voice, on this machine.

Starts `voicewire serve` in its own process and drives it with real WebSocket clients:

(a) TTFP given text: a whole first sentence + text.flush -> first audio byte, 1 session and N
    concurrent sessions, >= 50 turns each.
(b) TTFP under streaming text: first delta sent -> first audio byte, words arriving at 20/s.
(c) Capacity: the largest number of concurrent sessions whose turns all play in real time with
    zero underruns (playback simulated from each turn's first audio byte, no extra buffer).

    python benchmarks/ws_bench.py --out benchmarks/results/ws_cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import websockets

RATE_HZ = 24_000
BYTES_PER_S = RATE_HZ * 2
SENTENCES = [
    "Sure, I can help you with that right away.",
    "Your appointment is confirmed for Tuesday at ten in the morning.",
    "The package left our warehouse yesterday and should arrive soon.",
    "Could you please repeat the last four digits of your card?",
    "Thanks for waiting, I have found the information you asked for.",
    "Let me check the schedule and get back to you in a moment.",
]
PARAGRAPH = (
    "Thanks for calling, I can help with that. Your order shipped this morning and the tracking number "
    "is on its way to your inbox. It should arrive by Thursday, and you can change the delivery address "
    "until tomorrow evening. Is there anything else I can do for you today?"
)


@dataclass
class TurnStats:
    ttfp_s: float | None = None
    audio_s: float = 0.0
    underrun: bool = False
    max_late_s: float = 0.0
    server_metrics: dict[str, Any] = field(default_factory=dict)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def summary_ms(values: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values]
    return {
        "n": len(ms),
        "p50_ms": round(pct(ms, 50), 2),
        "p95_ms": round(pct(ms, 95), 2),
        "max_ms": round(max(ms), 2) if ms else float("nan"),
        "mean_ms": round(statistics.fmean(ms), 2) if ms else float("nan"),
    }


async def run_turn(ws: Any, turn_id: str, text: str, words_per_s: float | None) -> TurnStats:
    """Send one turn (whole + flush, or word deltas), read until turn.done, simulate playback."""
    st = TurnStats()
    t_first_sent = time.perf_counter()

    async def send() -> None:
        if words_per_s is None:
            await ws.send(json.dumps({"type": "text.delta", "turn_id": turn_id, "text": text}))
            await ws.send(json.dumps({"type": "text.flush", "turn_id": turn_id}))
        else:
            words = text.split(" ")
            for i, w in enumerate(words):
                await ws.send(json.dumps({"type": "text.delta", "turn_id": turn_id, "text": w + " " * (i < len(words) - 1)}))
                await asyncio.sleep(1 / words_per_s)
        await ws.send(json.dumps({"type": "text.end", "turn_id": turn_id}))

    sender = asyncio.create_task(send())
    t_first_audio = None
    received_s = 0.0
    while True:
        msg = await asyncio.wait_for(ws.recv(), 60)
        now = time.perf_counter()
        if isinstance(msg, bytes):
            if t_first_audio is None:
                t_first_audio = now
                st.ttfp_s = now - t_first_sent
            else:
                # Playback started at the first byte: by now the player has used (now - t_first_audio)
                # seconds; if it had less than that, it ran dry before this message came.
                late = (now - t_first_audio) - received_s
                if late > 0:
                    st.underrun = True
                    st.max_late_s = max(st.max_late_s, late)
            received_s += len(msg) / BYTES_PER_S
            continue
        data = json.loads(msg)
        if data.get("type") == "turn.done" and data.get("turn_id") == turn_id:
            st.server_metrics = data.get("metrics", {})
            break
        if data.get("type") == "error":
            raise RuntimeError(f"server error: {data}")
    await sender
    st.audio_s = received_s
    return st


async def connect(url: str) -> Any:
    ws = await websockets.connect(url, max_size=None)
    await ws.recv()  # session.created
    return ws


async def session_loop(url: str, turns: int, words_per_s: float | None, texts: list[str], start_delay_s: float) -> list[TurnStats]:
    await asyncio.sleep(start_delay_s)
    ws = await connect(url)
    out = []
    try:
        for i in range(turns):
            out.append(await run_turn(ws, f"t{i}", texts[i % len(texts)], words_per_s))
            await asyncio.sleep(0.2)  # the agent's next turn comes a moment later
    finally:
        await ws.close()
    return out


async def scenario(url: str, sessions: int, turns: int, words_per_s: float | None, texts: list[str], stagger_s: float) -> list[TurnStats]:
    rng = random.Random(sessions)
    tasks = [
        session_loop(url, turns, words_per_s, texts[i % len(texts):] + texts[: i % len(texts)], rng.uniform(0, stagger_s))
        for i in range(sessions)
    ]
    results = await asyncio.gather(*tasks)
    return [t for r in results for t in r]


def start_server(port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "voicewire.realtime.cli", "serve", "--port", str(port), "--log-level", "warning"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(200):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                if r.status == 200:
                    if proc.poll() is not None:
                        raise RuntimeError(f"port {port} is taken by another server")
                    return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("server did not start")


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    url = f"ws://127.0.0.1:{args.port}/v1/stream"
    out: dict[str, Any] = {}
    # warm-up
    await scenario(url, 2, 2, None, SENTENCES, 0.0)

    print("(a) TTFP, whole sentence + flush", flush=True)
    one = await scenario(url, 1, args.turns, None, SENTENCES, 0.0)
    out["a_ttfp_whole_sentence_1_session"] = summary_ms([t.ttfp_s for t in one if t.ttfp_s is not None])
    many = await scenario(url, args.concurrent, max(3, args.turns // args.concurrent + 1), None, SENTENCES, 0.5)
    out[f"a_ttfp_whole_sentence_{args.concurrent}_sessions"] = summary_ms([t.ttfp_s for t in many if t.ttfp_s is not None])
    print(json.dumps({k: v for k, v in out.items()}, indent=1), flush=True)

    print("(b) TTFP, streaming text at 20 words/s", flush=True)
    streamed = await scenario(url, 1, args.turns, 20.0, [PARAGRAPH], 0.0)
    out["b_ttfp_streaming_20wps_1_session"] = summary_ms([t.ttfp_s for t in streamed if t.ttfp_s is not None])
    print(json.dumps(out["b_ttfp_streaming_20wps_1_session"]), flush=True)

    print(f"(c) capacity sweep, streaming text at 20 words/s, {args.capacity_turns} turns per session, "
          f"sessions start within {args.stagger} s", flush=True)
    sweep = []
    best = 0
    for n in args.sweep:
        turns = await scenario(url, n, args.capacity_turns, 20.0, [PARAGRAPH, *SENTENCES], args.stagger)
        underruns = sum(t.underrun for t in turns)
        row = {
            "sessions": n,
            "turns": len(turns),
            "turns_with_underrun": underruns,
            "worst_stall_ms": round(max(t.max_late_s for t in turns) * 1000, 1),
            "ttfp": summary_ms([t.ttfp_s for t in turns if t.ttfp_s is not None]),
            "audio_s_total": round(sum(t.audio_s for t in turns), 1),
        }
        sweep.append(row)
        print(json.dumps(row), flush=True)
        if underruns == 0:
            best = max(best, n)
        elif n > best:
            break
    out["c_capacity_sweep"] = sweep
    out["c_setup"] = {"stagger_s": args.stagger, "turns_per_session": args.capacity_turns, "words_per_s": 20}
    out["c_max_realtime_sessions_zero_underruns"] = best
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results/ws_cpu.json")
    ap.add_argument("--port", type=int, default=8781)
    ap.add_argument("--turns", type=int, default=60)
    ap.add_argument("--concurrent", type=int, default=20)
    ap.add_argument("--stagger", type=float, default=5.0, help="(c): sessions start within this many seconds")
    ap.add_argument("--capacity-turns", type=int, default=3, help="(c): turns per session")
    ap.add_argument("--sweep", type=lambda s: [int(x) for x in s.split(",")], default=[10, 25, 50, 75, 100, 125, 150])
    args = ap.parse_args()
    server = start_server(args.port)
    try:
        results = asyncio.run(main_async(args))
    finally:
        server.terminate()
        server.wait(10)
    results["command"] = "python " + " ".join(sys.argv)
    results["machine"] = {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "note": "server and load generator share the same 2 cores",
    }
    results["date"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
