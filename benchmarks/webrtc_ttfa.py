"""Wire TTFA over WebRTC with the embedded voice, at 1 and N concurrent peers, on this machine.

Starts `voicewire serve` in its own process and drives it with real aiortc client peers (the
client library's ``WebRtcClient``: recvonly Opus track + ``control`` data channel, non-trickle
offer), each turn a reply of the load generator's simulated LLM.

Wire TTFA = first ``text.delta`` sent on the data channel -> first audible RTP packet received
(its Opus payload decoded; audible = a 10 ms window above -45 dBFS, the engine's onset rule). The
packet is timed as aiortc's receiver gets it, before its 80 ms jitter buffer: this is what reaches
the client's network stack, not what a browser plays (a browser adds its jitter buffer, ~40 ms).
``wire_first_sound`` times the first packet carrying any of the turn's audio instead: the engine
keeps 10 ms of quiet lead-in, and Opus's 6.5 ms look-ahead pushes the audible onset of a turn's
first 20 ms frame into the second packet, so the audible time is usually 20 ms later.

Two ways of sending a turn:
  whole:  the first sentence in one delta, then text.end (the agent already has the sentence)
  stream: one word per delta at --words-per-s (an LLM streaming its reply)

Peers speak turn after turn with a short random pause (closed loop); N peers start within 1 s.

    python benchmarks/webrtc_ttfa.py --out benchmarks/results/webrtc_ttfa.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import numpy as np
from ws_bench import SENTENCES, start_server, summary_ms, write_results

from voicewire.realtime.client.simulated_llm import send_reply
from voicewire.realtime.client.webrtc import SOUND_DBFS, WebRtcClient

PAUSE_S = (0.2, 0.6)  # between a turn's turn.done and the peer's next turn


@dataclass
class TurnResult:
    wire_ttfa_s: float | None  # to the first audible packet (a 10 ms window above the onset level)
    first_sound_s: float | None  # to the first packet carrying any of the turn's audio
    server_ttfp_ms: float | None  # first text -> first audio handed to the transport (turn.done)
    engine_ttfp_ms: float | None
    p99_inter_arrival_ms: float | None
    reason: str
    extra: dict[str, Any] = field(default_factory=dict)


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def ms_summary(values_ms: list[float]) -> dict[str, float]:
    return summary_ms([v / 1000 for v in values_ms])


async def run_turn(peer: WebRtcClient, turn_id: str, text: str, mode: str, words_per_s: float) -> TurnResult:
    turn = await peer.start_turn(turn_id)
    await send_reply(turn, text, None if mode == "whole" else words_per_s)
    done = await turn.done(timeout_s=60)
    gaps = peer.audible_inter_arrivals_s(turn)
    m = done.metrics
    return TurnResult(
        peer.wire_ttfa_s(turn),
        peer.wire_ttfa_s(turn, SOUND_DBFS),
        m.get("ttfp_ms"),
        m.get("engine_ttfp_ms"),
        round(pct(list(gaps), 99) * 1000, 2) if gaps.size else None,
        done.reason,
    )


async def peer_loop(url: str, index: int, turns: int, mode: str, words_per_s: float) -> list[TurnResult]:
    rng = random.Random(index)
    await asyncio.sleep(rng.uniform(0, 1.0) if index else 0.0)
    peer = await WebRtcClient.connect(url)
    await asyncio.sleep(0.3)  # the call settles before the first turn
    out = []
    try:
        for i in range(turns):
            text = SENTENCES[(index + i) % len(SENTENCES)]
            out.append(await run_turn(peer, f"{index}-{i}", text, mode, words_per_s))
            await asyncio.sleep(rng.uniform(*PAUSE_S))
    finally:
        await peer.close()
    return out


async def scenario(
    url: str, peers: int, turns: int, mode: str, words_per_s: float, cpu: CpuMeter
) -> dict[str, Any]:
    cpu.lap()
    t0 = time.perf_counter()
    results = await asyncio.gather(*(peer_loop(url, i, turns, mode, words_per_s) for i in range(peers)))
    flat = [r for rs in results for r in rs]
    ttfa = [r.wire_ttfa_s * 1000 for r in flat if r.wire_ttfa_s is not None]
    p99s = [r.p99_inter_arrival_ms for r in flat if r.p99_inter_arrival_ms is not None]
    row = {
        "peers": peers,
        "mode": mode,
        "words_per_s": words_per_s if mode == "stream" else None,
        "turns": len(flat),
        "turns_without_audio": sum(r.wire_ttfa_s is None for r in flat),
        "turns_not_completed": sum(r.reason != "completed" for r in flat),
        "wire_ttfa": ms_summary(ttfa),
        "wire_first_sound": ms_summary([r.first_sound_s * 1000 for r in flat if r.first_sound_s is not None]),
        "server_ttfp": ms_summary([r.server_ttfp_ms for r in flat if r.server_ttfp_ms is not None]),
        "engine_ttfp": ms_summary([r.engine_ttfp_ms for r in flat if r.engine_ttfp_ms is not None]),
        "wire_minus_server_ms": ms_summary(
            [
                r.wire_ttfa_s * 1000 - r.server_ttfp_ms
                for r in flat
                if r.wire_ttfa_s is not None and r.server_ttfp_ms is not None
            ]
        ),
        "p99_inter_arrival_ms": {
            "p50_over_turns": round(pct(p99s, 50), 1),
            "max_over_turns": round(max(p99s), 1) if p99s else None,
            "turns_over_30ms": sum(p > 30 for p in p99s),
        },
        "wall_s": round(time.perf_counter() - t0, 1),
        "cpu": cpu.lap(),
    }
    print(json.dumps(row), flush=True)
    return row


class CpuMeter:
    """Cores' worth of CPU used by this benchmark (client + server) and by everything else.

    The machine is shared: a number taken while something else runs is marked as such.
    """

    def __init__(self, server_pid: int) -> None:
        self._server_pid = server_pid
        self._tick_s = 1 / os.sysconf("SC_CLK_TCK")
        self._start = self._read()

    def _read(self) -> tuple[float, float, float, float]:
        """(machine busy CPU s, server CPU s, this process's CPU s, wall s)"""
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        busy = sum(fields) - fields[3] - fields[4]  # all but idle and iowait
        with open(f"/proc/{self._server_pid}/stat") as f:
            server = sum(int(x) for x in f.read().rsplit(")", 1)[1].split()[11:13])
        mine = os.times()
        return busy * self._tick_s, server * self._tick_s, mine.user + mine.system, time.monotonic()

    def lap(self) -> dict[str, float]:
        end = self._read()
        busy, server, client, wall = (e - s for e, s in zip(end, self._start, strict=True))
        self._start = end
        return {
            "server_cores": round(server / wall, 2),
            "client_cores": round(client / wall, 2),
            "other_processes_cores": round(max(0.0, busy - server - client) / wall, 2),
        }


async def main_async(args: argparse.Namespace, cpu: CpuMeter) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{args.port}"
    await scenario(url, 2, 2, "whole", args.words_per_s, cpu)  # warm-up, not reported
    rows = []
    for peers in args.peers:
        turns = args.turns if peers == 1 else max(3, args.turns // peers + 1)
        for mode in args.modes:
            rows.append(await scenario(url, peers, turns, mode, args.words_per_s, cpu))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results/webrtc_ttfa.json")
    ap.add_argument("--port", type=int, default=8766)
    ap.add_argument("--peers", type=lambda s: [int(x) for x in s.split(",")], default=[1, 10])
    ap.add_argument("--modes", type=lambda s: s.split(","), default=["whole", "stream"])
    ap.add_argument("--turns", type=int, default=40, help="turns at 1 peer; N peers do turns/N + 1 each")
    ap.add_argument("--words-per-s", type=float, default=20.0)
    ap.add_argument("--server-log", help="write the server's log (info level) here")
    args = ap.parse_args()
    load_before = os.getloadavg()
    server = start_server(args.port, args.server_log)
    try:
        rows = asyncio.run(main_async(args, CpuMeter(server.pid)))
    finally:
        server.terminate()
        server.wait(10)
    results: dict[str, Any] = {
        "what": "wire TTFA over WebRTC: first text.delta sent -> first audible RTP packet at an aiortc peer",
        "results": rows,
    }
    write_results(
        results,
        args.out,
        aiortc=metadata.version("aiortc"),
        aioice=metadata.version("aioice"),
        av=metadata.version("av"),
        load_avg_1m_before=round(load_before[0], 2),
        note="server (own process) and client peers (this process) share the same 2 cores",
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
