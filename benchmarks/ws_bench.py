"""Gateway benchmark over the WebSocket (protocol v1) with the embedded voice, on this machine.

Starts `voicewire serve` in its own process and drives it with the load generator's turns
(``voicewire.realtime.client.probe_turn.run_turn``: the protocol-v1 client, the simulated LLM, the one
listener model):

(a) TTFP given text: a whole first sentence in one delta -> first audio byte, 1 session and N
    concurrent sessions, >= 50 turns each.
(b) TTFP under streaming text: first delta sent -> first audio byte, words arriving at 20/s.
(c) Capacity: the largest number of concurrent sessions whose turns all play in real time with
    zero underruns (``voicewire.engine.Playout`` from each turn's first audio byte, no extra buffer).

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
from pathlib import Path
from typing import Any

from voicewire.realtime.client import VoicewireClient
from voicewire.realtime.client.probe_turn import ProbeConfig, TurnRecord, run_turn
from voicewire.realtime.client.simulated_llm import TEXTS

SENTENCES = list(TEXTS[:6])
PARAGRAPH = (
    "Thanks for calling, I can help with that. Your order shipped this morning and the tracking number "
    "is on its way to your inbox. It should arrive by Thursday, and you can change the delivery address "
    "until tomorrow evening. Is there anything else I can do for you today?"
)
NEXT_TURN_S = 0.2  # the agent's next turn comes a moment later


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


def turn_config(url: str, words_per_s: float | None) -> ProbeConfig:
    """The probe's turn: ``words_per_s`` None sends the whole text in one delta; zero-buffer listener."""
    return ProbeConfig(url=url, tokens_per_s=words_per_s, buffer_ms=0.0)


async def session_loop(
    url: str, turns: int, words_per_s: float | None, texts: list[str], start_delay_s: float
) -> list[TurnRecord]:
    await asyncio.sleep(start_delay_s)
    cfg = turn_config(url, words_per_s)
    out = []
    async with await VoicewireClient.connect(url) as client:
        for i in range(turns):
            text = texts[i % len(texts)]
            t0 = time.perf_counter()
            out.append(await run_turn(client, text, cfg, TurnRecord(0, i, 0.0, len(text.split())), t0))
            await asyncio.sleep(NEXT_TURN_S)
    return out


async def scenario(
    url: str, sessions: int, turns: int, words_per_s: float | None, texts: list[str], stagger_s: float
) -> list[TurnRecord]:
    rng = random.Random(sessions)
    tasks = [
        session_loop(
            url,
            turns,
            words_per_s,
            texts[i % len(texts) :] + texts[: i % len(texts)],
            rng.uniform(0, stagger_s),
        )
        for i in range(sessions)
    ]
    results = await asyncio.gather(*tasks)
    return [t for r in results for t in r]


def ttfp_s(turns: list[TurnRecord]) -> list[float]:
    """First text sent -> first audio byte, per turn that had audio."""
    return [t.ttfb_ms / 1000 for t in turns if t.ttfb_ms is not None]


def start_server(
    port: int, log_path: str | None = None, extra: tuple[str, ...] = ()
) -> subprocess.Popen[bytes]:
    """``voicewire serve`` in its own process, as a user starts it (``extra``: more serve flags);
    returns once it is ready (warm)."""
    log = open(log_path, "wb") if log_path else subprocess.DEVNULL  # noqa: SIM115 - the server's
    level = "info" if log_path else "warning"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "voicewire.realtime.cli",
            "serve",
            "--port",
            str(port),
            "--log-level",
            level,
            *extra,
        ],
        stdout=log,
        stderr=log,
    )
    for _ in range(300):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                if r.status == 200:
                    if proc.poll() is not None:
                        raise RuntimeError(f"port {port} is taken by another server")
                    return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("server did not start")


def write_results(results: dict[str, Any], out: str, **machine: Any) -> None:
    """Add the command, the machine and the date; write ``out``."""
    results["command"] = "python " + " ".join(sys.argv)
    results["machine"] = {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        **machine,
    }
    results["date"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(results, indent=2) + "\n")


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    url = f"ws://127.0.0.1:{args.port}/v1/stream"
    out: dict[str, Any] = {}
    # warm-up
    await scenario(url, 2, 2, None, SENTENCES, 0.0)

    print("(a) TTFP, whole sentence", flush=True)
    one = await scenario(url, 1, args.turns, None, SENTENCES, 0.0)
    out["a_ttfp_whole_sentence_1_session"] = summary_ms(ttfp_s(one))
    many = await scenario(
        url, args.concurrent, max(3, args.turns // args.concurrent + 1), None, SENTENCES, 0.5
    )
    out[f"a_ttfp_whole_sentence_{args.concurrent}_sessions"] = summary_ms(ttfp_s(many))
    print(json.dumps({k: v for k, v in out.items()}, indent=1), flush=True)

    print("(b) TTFP, streaming text at 20 words/s", flush=True)
    streamed = await scenario(url, 1, args.turns, 20.0, [PARAGRAPH], 0.0)
    out["b_ttfp_streaming_20wps_1_session"] = summary_ms(ttfp_s(streamed))
    print(json.dumps(out["b_ttfp_streaming_20wps_1_session"]), flush=True)

    print(
        f"(c) capacity sweep, streaming text at 20 words/s, {args.capacity_turns} turns per session, "
        f"sessions start within {args.stagger} s",
        flush=True,
    )
    sweep = []
    best = 0
    for n in args.sweep:
        turns = await scenario(url, n, args.capacity_turns, 20.0, [PARAGRAPH, *SENTENCES], args.stagger)
        underruns = sum(t.underruns > 0 for t in turns)
        row = {
            "sessions": n,
            "turns": len(turns),
            "turns_with_underrun": underruns,
            "worst_stall_ms": round(max(t.max_stall_ms for t in turns), 1),
            "ttfp": summary_ms(ttfp_s(turns)),
            "audio_s_total": round(sum(t.audio_ms for t in turns) / 1000, 1),
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
    ap.add_argument("--serve-args", default="", help="more `voicewire serve` flags, e.g. '--replicas 0'")
    ap.add_argument(
        "--sweep", type=lambda s: [int(x) for x in s.split(",")], default=[10, 25, 50, 75, 100, 125, 150]
    )
    args = ap.parse_args()
    server = start_server(args.port, extra=tuple(args.serve_args.split()))
    try:
        results = asyncio.run(main_async(args))
    finally:
        server.terminate()
        server.wait(10)
    write_results(results, args.out, note="server and load generator share the same 2 cores")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
