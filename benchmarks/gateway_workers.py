"""How many WebRTC peers one gateway process paces, and how many ``--workers N`` do, in front of the
same engine core.

A local Ray cluster (benchmarks/ray_cluster.py), one core started by `voicewire engine --ray` (the
model flags after ``--``: the embedded voice by default, Qwen3-TTS on CUDA on the device), then for
each worker count `voicewire gateway --ray ADDRESS --workers N` on one port (SO_REUSEPORT), driven
by real aiortc peers (benchmarks/webrtc_ttfa.py's peer loop: words streamed at ``--words-per-s``)
from ``--client-procs`` processes of their own, so the load generator is not what runs out. At each
peer count of ``--peers`` a turn is late when its audio's p99 packet inter-arrival exceeds
``--gap-ms`` or it does not complete; the capacity of a worker count is the most peers with no late
turn, and the file says each and their ratio.

    python benchmarks/gateway_workers.py --workers 1,4 --peers 8,16,32,64 \\
        --out benchmarks/results/gateway_workers.json -- --model qwen3-tts --device cuda --random-weights
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import sys
import time
from typing import Any

from ray_cluster import VOICEWIRE, LocalCluster, free_port, kill_trees, ready
from ws_bench import write_results


def client_proc(url: str, first: int, peers: int, turns: int, words_per_s: float) -> list[dict[str, Any]]:
    """One load process: ``peers`` peers (indices from ``first``), each ``turns`` turns."""
    import webrtc_ttfa

    async def run() -> list[Any]:
        loops = (webrtc_ttfa.peer_loop(url, first + i, turns, "stream", words_per_s) for i in range(peers))
        return [r for rs in await asyncio.gather(*loops) for r in rs]

    return [
        {"p99_gap_ms": r.p99_inter_arrival_ms, "reason": r.reason, "wire_ttfa_s": r.wire_ttfa_s}
        for r in asyncio.run(run())
    ]


def sweep_point(url: str, peers: int, args: argparse.Namespace) -> dict[str, Any]:
    procs = max(1, min(args.client_procs, peers))
    shares = [peers // procs + (i < peers % procs) for i in range(procs)]
    firsts = [sum(shares[:i]) for i in range(procs)]
    t0 = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(procs) as pool:
        parts = pool.starmap(
            client_proc,
            [(url, f, n, args.turns, args.words_per_s) for f, n in zip(firsts, shares, strict=True)],
        )
    turns = [t for part in parts for t in part]
    gaps = sorted(t["p99_gap_ms"] for t in turns if t["p99_gap_ms"] is not None)
    late = sum(
        t["reason"] != "completed" or t["p99_gap_ms"] is None or t["p99_gap_ms"] > args.gap_ms for t in turns
    )
    ttfa = sorted(t["wire_ttfa_s"] * 1000 for t in turns if t["wire_ttfa_s"] is not None)
    return {
        "peers": peers,
        "turns": len(turns),
        "late_turns": late,
        "p99_gap_ms_median": round(gaps[len(gaps) // 2], 1) if gaps else None,
        "p99_gap_ms_max": round(gaps[-1], 1) if gaps else None,
        "wire_ttfa_ms_p95": round(ttfa[int(0.95 * (len(ttfa) - 1))], 1) if ttfa else None,
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def main() -> None:
    argv = sys.argv[1:]
    model = argv[argv.index("--") + 1 :] if "--" in argv else []
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4])
    ap.add_argument("--peers", type=lambda s: [int(x) for x in s.split(",")], default=[4, 8, 16, 32])
    ap.add_argument("--turns", type=int, default=3, help="turns per peer at each point")
    ap.add_argument("--words-per-s", type=float, default=20.0)
    ap.add_argument(
        "--gap-ms", type=float, default=30.0, help="a turn whose p99 packet gap is above this is late"
    )
    ap.add_argument("--client-procs", type=int, default=max(1, (os.cpu_count() or 2) // 4))
    ap.add_argument("--ready-timeout-s", type=float, default=600.0)
    ap.add_argument("--out", default="benchmarks/results/gateway_workers.json")
    args = ap.parse_args(argv[: argv.index("--")] if "--" in argv else argv)

    results: dict[str, Any] = {
        "what": "concurrent WebRTC peers (words streamed) that N gateway processes on one port pace "
        f"with every turn's p99 packet gap <= {args.gap_ms:g} ms and none late, the same engine core",
        "engine_flags": model,
        "gap_ms": args.gap_ms,
        "words_per_s": args.words_per_s,
        "client_procs": args.client_procs,
        "sweeps": {},
    }
    with LocalCluster(cpus=os.cpu_count() or 2) as cluster:
        cluster.run(
            [*VOICEWIRE, "engine", "--ray", cluster.address, "--replicas", "1", *model], args.ready_timeout_s
        )
        for workers in args.workers:
            port = free_port()
            gateway = cluster.spawn([*VOICEWIRE, "gateway", "--ray", cluster.address, "--port", str(port),
                                     "--workers", str(workers), "--log-level", "warning"], f"gateway{workers}")  # fmt: skip
            try:
                ready(port, 120)
                url = f"http://127.0.0.1:{port}"
                sweep_point(url, 2, argparse.Namespace(**{**vars(args), "turns": 1}))  # warm-up, not reported
                rows = []
                for peers in args.peers:
                    rows.append(sweep_point(url, peers, args))
                    print(f"[workers {workers}] {json.dumps(rows[-1])}", flush=True)
                    clean = [r["peers"] for r in rows if not r["late_turns"]]
                    results["sweeps"][str(workers)] = {"rows": rows, "capacity_peers": max(clean, default=0)}
                    write_results(results, args.out)  # a run stopped by its time limit keeps what it measured
                    if rows[-1]["late_turns"]:
                        break  # past this gateway's capacity
            finally:
                kill_trees([gateway])  # and its workers: the next sweep starts on an idle machine
                cluster.procs.remove(gateway)
    caps = {w: s["capacity_peers"] for w, s in results["sweeps"].items()}
    if len(caps) >= 2 and min(caps.values()):
        lo, hi = min(caps, key=int), max(caps, key=int)
        results["ratio"] = {f"{hi}_over_{lo}": round(caps[hi] / caps[lo], 2)}
    write_results(results, args.out)
    print(json.dumps({"capacity_peers": caps, **({"ratio": results["ratio"]} if "ratio" in results else {})}))


if __name__ == "__main__":
    main()
