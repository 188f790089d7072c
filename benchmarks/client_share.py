"""One client's share of the embedded voice on this machine: a victim client's time to first
audio while another client floods the server (the floods and the victim of
tests/gateway/test_quotas.py, run several times and written with their figures).

    python benchmarks/client_share.py --rounds 3 --out benchmarks/results/client_share_cpu.json

Each round: a fresh in-process engine and gateway, an 8-s flood from its own process, the victim
(127.0.0.2) speaking a sentence every 0.2 s beside it; p50 / p95 / max of the victim's turns.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.speech_formats import _meta
from tests.conftest import running_gateway
from tests.gateway import victim
from tests.gateway.test_quotas import _flood
from voicewire.engine import Engine, EngineConfig

FLOODS = {
    "one_client_300_sessions_100_speech_50_uploads": ["--sessions", "300", "--speech", "100", "--uploads", "50"],
    "three_clients_a_delta_every_ms": [
        a for addr in ("127.0.0.3", "127.0.0.4", "127.0.0.5") for a in ("--deltas-from", addr)
    ],
}


async def _round(flood: list[str]) -> dict[str, Any]:
    engine = Engine(EngineConfig(model="hibari")).start()
    try:
        async with running_gateway(engine) as base:
            await victim.victim_ttfp_ms(base)  # warm
            ttfps: list[float] = []
            try:
                async with victim.victim_alongside(base, min_turns=10) as ttfps:
                    counts = await _flood(base, *flood, "--duration-s", "8")
            except AssertionError:
                pass  # over the bound: recorded as measured
    finally:
        engine.close()
    return {
        "victim_turns": len(ttfps),
        "ttfp_ms": {
            "p50": round(statistics.median(ttfps), 1),
            "p95": round(victim.p95(ttfps), 1),
            "max": round(max(ttfps), 1),
        },
        "flood": counts,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results/client_share_cpu.json")
    args = ap.parse_args()
    started = time.monotonic()
    result = {name: [asyncio.run(_round(flood)) for _ in range(args.rounds)] for name, flood in FLOODS.items()}
    out = {"meta": _meta(started), "bound_p95_ms": victim.VICTIM_P95_MS, **result}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    for name, rounds in result.items():
        print(name, [r["ttfp_ms"]["p95"] for r in rounds])


if __name__ == "__main__":
    main()
