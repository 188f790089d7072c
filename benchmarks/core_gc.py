"""An engine core's garbage collections under load: the oldest generation held to the moments no stream
is in flight (``heap.QuietCollections``, the default) against the collector's own rule.

    python benchmarks/core_gc.py --rate 150 --duration-s 20 --rounds 2 --out core_gc_cpu.json [--step-ms 20]

A core process as ``voicewire serve`` starts one (``CoreClient``) around the null-device Qwen3 model
(qwen3_null_device.py: the served model's host code at serving scale, its device work free but for a
wait of ``--step-ms`` a frame step, so a stream lives about as long as under a GPU's load), an open loop
of whole turns in the committed length mix from this process (engine_load.py). While turns are in
flight the core's collections are read from its heartbeat (twice a second): how many since ready,
their time, the longest; the figures kept are the last ones heard before the load ended, so the
collection the held rule makes once the core is quiet is not among them. The variants alternate, each
in a fresh core.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_load import Lengths, load_config, open_loop
from ws_bench import write_results

from voicewire.engine.core import CoreClient
from voicewire.engine.stats import EngineStats

MODEL = "qwen3_null_device:null_device_qwen3"
SLOTS = 1024
LENGTH_SCALE = 0.74  # the committed mix scaled to the front door's replies (3.4-s mean), as gpu.sh does
VARIANTS = {"held": None, "collector": 0.0}  # full_collection_busy_max_s (None: a core's default)


def core_gc(stats: EngineStats) -> dict[str, float]:
    return {
        "collections": stats.gc_collections,
        "pause_ms_total": round(stats.gc_pause_s * 1e3, 2),
        "pause_ms_max_since_ready": round(stats.gc_pause_max_since_ready_s * 1e3, 2),
    }


async def one_run(busy_max_s: float | None, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    config = load_config(
        MODEL,
        SLOTS,
        model_options={"max_slots": SLOTS, "max_batch": 256, "step_s": args.step_ms / 1e3},
        full_collection_busy_max_s=busy_max_s,
    )
    async with CoreClient(config) as core:
        heard: dict[str, float] = {}
        done = asyncio.Event()

        async def watch() -> None:
            while not done.is_set():
                if core.active_streams():
                    heard.update(core_gc(core.stats))
                await asyncio.sleep(0.1)

        watcher = asyncio.create_task(watch())
        t0 = time.perf_counter()
        lengths = Lengths(LENGTH_SCALE)
        load = await open_loop(core, args.rate, args.duration_s, lengths, seed)  # type: ignore[arg-type]
        done.set()
        await watcher
        return {
            "core_gc_while_busy": heard,
            "wall_s": round(time.perf_counter() - t0, 1),
            **{k: load[k] for k in ("requests", "completed", "rejected", "errors", "underrun_requests")},
            "ttfp_ms": {q: load[f"ttfp_ms_{q}"] for q in ("p50", "p95", "p99", "max")},
            "host_ms_per_step": load["engine"]["host_ms_per_step"],
            "steps": load["engine"]["steps"],
        }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    runs = []
    for r in range(args.rounds):
        for name, busy_max_s in VARIANTS.items():
            run = await one_run(busy_max_s, args, seed=r)
            run.update(variant=name, round=r)
            print(name, r, run, flush=True)
            runs.append(run)
    return {
        "what": "an engine core (null-device Qwen3 model) under an open loop of whole turns: its collections "
        "while turns were in flight, oldest generation held to quiet moments against the collector's "
        "own rule",
        "rate": args.rate,
        "duration_s": args.duration_s,
        "step_ms": args.step_ms,
        "variants": {k: {"full_collection_busy_max_s": v} for k, v in VARIANTS.items()},
        "runs": runs,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=float, default=150.0)
    ap.add_argument("--duration-s", type=float, default=20.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--step-ms", type=float, default=20.0, help="a frame step's simulated device time")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    write_results(asyncio.run(main_async(args)), args.out)


if __name__ == "__main__":
    main()
