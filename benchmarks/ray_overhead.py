"""What Ray costs on the data path: the same gateway in front of an embedded-voice core placed by Ray
on a second node, against `voicewire serve` as it is (its core a process on the same host), in
alternating rounds on this machine.

A local two-node cluster (a head and a second raylet with its own custom resource, as
docs/across-hosts.md starts them), `voicewire engine --ray ADDRESS --resources '{"node2": 1}'` and
`voicewire gateway --ray ADDRESS`; beside it `voicewire serve`. Both stay up the whole run, so the
cluster's own processes load both arms alike; each round runs ``--turns`` one-session turns (a
whole sentence in one delta, first text -> first audio byte) on one arm, then on the other, the
order swapped every round.

    python benchmarks/ray_overhead.py --out benchmarks/results/ray_overhead_cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
from typing import Any

from ray_cluster import VOICEWIRE, LocalCluster, free_port, ready
from ws_bench import SENTENCES, pct, scenario, start_server, summary_ms, ttfp_s, write_results

ARMS = ("serve", "ray")
P50_BUDGET_MS = 3.0  # Ray may add at most this to p50, and 10% to p95: it is the control plane only
P95_BUDGET = 1.10


def run_rounds(ports: dict[str, int], rounds: int, turns: int) -> dict[str, list[list[float]]]:
    """TTFP seconds per arm per round, the arms alternating (serve first in even rounds)."""
    out: dict[str, list[list[float]]] = {arm: [] for arm in ARMS}
    for r in range(rounds):
        for arm in ARMS if r % 2 == 0 else ARMS[::-1]:
            url = f"ws://127.0.0.1:{ports[arm]}/v1/stream"
            out[arm].append(ttfp_s(asyncio.run(scenario(url, 1, turns, None, SENTENCES, 0.0))))
            print(f"round {r} {arm}: p50 {pct(out[arm][-1], 50) * 1000:.1f} ms", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--turns", type=int, default=40, help="turns per arm per round")
    ap.add_argument("--out", default="benchmarks/results/ray_overhead_cpu.json")
    args = ap.parse_args()

    ports = {arm: free_port() for arm in ARMS}
    serve: subprocess.Popen[bytes] | None = None
    with LocalCluster(second_node=True) as cluster:
        try:
            engine = ["engine", "--ray", cluster.address, "--replicas", "1", "--resources", '{"node2": 1}']
            cluster.run([*VOICEWIRE, *engine], timeout_s=180)
            cluster.spawn([*VOICEWIRE, "gateway", "--ray", cluster.address, "--port", str(ports["ray"]),
                           "--log-level", "warning"], "gateway")  # fmt: skip
            ready(ports["ray"], 60)
            serve = start_server(ports["serve"])
            for port in ports.values():  # warm both: the first turns of a process are not the tenth
                asyncio.run(scenario(f"ws://127.0.0.1:{port}/v1/stream", 1, 10, None, SENTENCES, 0.0))
            rounds = run_rounds(ports, args.rounds, args.turns)
        finally:
            if serve is not None:
                serve.terminate()  # a clean stop: it stops its own core
                serve.wait(30)

    pooled = {arm: summary_ms([t for r in rounds[arm] for t in r]) for arm in ARMS}
    per_round = {arm: [summary_ms(r) for r in rounds[arm]] for arm in ARMS}
    p50_delta = pooled["ray"]["p50_ms"] - pooled["serve"]["p50_ms"]
    p95_ratio = pooled["ray"]["p95_ms"] / pooled["serve"]["p95_ms"]
    results: dict[str, Any] = {
        "what": "TTFP (first text -> first audio byte), one session, whole sentences, embedded voice: "
        "`voicewire serve` (its core on this host) against `voicewire gateway --ray` with the core "
        "placed by Ray on a second node, alternating rounds",
        "rounds": args.rounds,
        "turns_per_round": args.turns,
        "pooled": pooled,
        "per_round": per_round,
        "ray_minus_serve_p50_ms": round(p50_delta, 2),
        "ray_over_serve_p95": round(p95_ratio, 3),
        "within_bounds": p50_delta <= P50_BUDGET_MS and p95_ratio <= P95_BUDGET,
    }
    write_results(results, args.out)
    print(
        json.dumps(
            {k: results[k] for k in ("pooled", "ray_minus_serve_p50_ms", "ray_over_serve_p95")}, indent=1
        )
    )


if __name__ == "__main__":
    main()
