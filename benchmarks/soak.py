"""Soak: many concurrent WebSocket sessions with the embedded voice for minutes, on this machine.

Each session loops: a turn of the load generator (``probe_turn.run_turn``: word deltas from the simulated
LLM, the audio read and played by the one listener model from the first byte), then a pause, then
the next turn. Reports errors, lost turns
(text sent, no turn.done), underruns, TTFP/TTFA percentiles and the server's RSS at start and end.

    python benchmarks/soak.py --sessions 100 --duration 300 --out benchmarks/results/soak_cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ws_bench import SENTENCES, start_server, summary_ms, turn_config, write_results

from voicewire.realtime.client import VoicewireClient
from voicewire.realtime.client.probe_turn import TurnRecord, run_turn

STEADY_AFTER_S = 30.0


@dataclass
class Totals:
    turns_sent: int = 0
    turns_done: int = 0
    turns_with_underrun: int = 0
    errors: list[str] = field(default_factory=list)
    ttfp_s: list[float] = field(default_factory=list)
    ttfa_ms: list[float] = field(default_factory=list)  # server's audible TTFA per turn
    audio_s: float = 0.0


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def session(
    url: str,
    until: float,
    rng: random.Random,
    totals: Totals,
    words_per_s: float,
    user_turn_s: tuple[float, float],
) -> None:
    await asyncio.sleep(rng.uniform(0, 5))
    try:
        client = await VoicewireClient.connect(url)
    except Exception as err:
        totals.errors.append(f"connect: {err!r}")
        return
    cfg = turn_config(url, words_per_s)
    n = 0
    try:
        while time.monotonic() < until and not client.closed:
            text = " ".join(rng.sample(SENTENCES, 2))
            totals.turns_sent += 1
            t0 = time.perf_counter()
            rec = await run_turn(client, text, cfg, TurnRecord(0, n, 0.0, len(text.split())), t0)
            n += 1
            if rec.ttfb_ms is not None:
                totals.ttfp_s.append(rec.ttfb_ms / 1000)
            if rec.done_ms is not None:
                totals.turns_done += 1
                if "ttfa_ms" in rec.server:
                    totals.ttfa_ms.append(rec.server["ttfa_ms"])
            if rec.reason not in ("completed", "cancelled"):
                totals.errors.append(f"{rec.reason}: {rec.error}")
            totals.audio_s += rec.audio_ms / 1000
            totals.turns_with_underrun += rec.underruns > 0
            # The listener hears the rest of the turn, then the user talks for a moment.
            heard_s = t0 + rec.t_start_s + (rec.e2e_ms or 0.0) / 1000
            await asyncio.sleep(max(0.0, heard_s - time.perf_counter()) + rng.uniform(*user_turn_s))
    except Exception as err:
        totals.errors.append(f"session: {err!r}")
    finally:
        await client.close()


async def main_async(args: argparse.Namespace, pid: int) -> dict[str, Any]:
    url = f"ws://127.0.0.1:{args.port}/v1/stream"
    totals = Totals()
    # warm-up turn, then the starting RSS
    await session(url, time.monotonic() + 0.1, random.Random(0), Totals(), args.words_per_s, args.user_turn_s)
    rss_start = rss_mb(pid)
    until = time.monotonic() + args.duration
    rss_samples: list[tuple[float, float]] = []

    async def sample() -> None:
        t0 = time.monotonic()
        while time.monotonic() < until + 10:
            rss_samples.append((round(time.monotonic() - t0, 1), round(rss_mb(pid), 1)))
            print(
                f"\r{rss_samples[-1][0]:6.0f} s  turns done {totals.turns_done}  errors {len(totals.errors)}  "
                f"RSS {rss_samples[-1][1]:.0f} MB",
                end="",
                flush=True,
            )
            await asyncio.sleep(5)

    sampler = asyncio.create_task(sample())
    await asyncio.gather(
        *(
            session(url, until, random.Random(i + 1), totals, args.words_per_s, args.user_turn_s)
            for i in range(args.sessions)
        )
    )
    sampler.cancel()
    print()
    rss_end = rss_mb(pid)
    # Growth is measured from the first sample once every session is connected and talking (the
    # first 30 s allocate each session's buffers and onnxruntime's arenas), so it shows leaks.
    steady = next((mb for t, mb in rss_samples if t >= STEADY_AFTER_S), rss_start)
    return {
        "sessions": args.sessions,
        "duration_s": args.duration,
        "words_per_s": args.words_per_s,
        "user_turn_s": list(args.user_turn_s),
        "turns_sent": totals.turns_sent,
        "turns_done": totals.turns_done,
        "lost_turns": totals.turns_sent - totals.turns_done,
        "errors": len(totals.errors),
        "error_samples": totals.errors[:10],
        "turns_with_underrun": totals.turns_with_underrun,
        "ttfp_first_byte": summary_ms(totals.ttfp_s),
        "ttfa_audible_server_ms": summary_ms([v / 1000 for v in totals.ttfa_ms]),
        "audio_s_total": round(totals.audio_s, 1),
        "rss_start_mb": round(rss_start, 1),
        "rss_end_mb": round(rss_end, 1),
        "rss_steady_start_mb": steady,
        "rss_growth_pct": round(100 * (rss_end - steady) / steady, 2),
        "rss_growth_pct_from_idle": round(100 * (rss_end - rss_start) / rss_start, 2),
        "rss_samples": rss_samples,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=100)
    ap.add_argument("--duration", type=float, default=300.0)
    ap.add_argument("--words-per-s", type=float, default=20.0)
    ap.add_argument(
        "--user-turn-s",
        type=lambda v: tuple(float(x) for x in v.split(",")),
        default=(0.5, 2.0),
        help="pause after each turn has played (the user talking), uniform in MIN,MAX seconds",
    )
    ap.add_argument("--port", type=int, default=8782)
    ap.add_argument("--out", default="benchmarks/results/soak_cpu.json")
    args = ap.parse_args()
    server = start_server(args.port)
    try:
        results = asyncio.run(main_async(args, server.pid))
    finally:
        server.terminate()
        server.wait(30)
    write_results(results, args.out, note="server and load generator share the same 2 cores")
    print(json.dumps({k: v for k, v in results.items() if k != "rss_samples"}, indent=1))


if __name__ == "__main__":
    main()
