"""Where the frame step's GPU time goes: the kernels of the captured decode graph, grouped by name.

    python3 benchmarks/profile_step.py --size 1.7b --batches 1,64 --variants fused,fused-nopdl --out p.json

Per variant (serving_bench.py's step variants) and batch size: the replay time of the decode graph
(CUDA events), and from torch.profiler (CUPTI sees the kernels inside graph replays) each kernel
name's launches and microseconds per step. ``kernel_us_per_step`` is the sum of kernel durations;
without PDL the difference to the replay time is the GPU idling between dependent kernels (launch and
ramp); with PDL kernels overlap, so the sum may exceed the replay time.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serving_bench import FUSED_VARIANTS, build, close_streams, env, gpu_ms, open_streams

from voicewire.engine.qwen3 import ExperimentalOptions, FusedSettings
from voicewire.engine.qwen3.cuda_graphs import bucket_for
from voicewire.engine.qwen3.frame_step import NO_CODEC, pack_prefill_row

TOP = 25  # kernel names kept per table


def profile_batch(model: Any, b: int, context: int, steps: int) -> dict[str, Any]:
    dev = model.device
    slots = list(range(b))
    open_streams(model, slots, context + steps + 200, greedy=False)
    for _ in range(context + 1):  # the prefill, then a typical stream's context
        model.generate(slots)
    bucket = bucket_for(b, model.decode_buckets)
    rows = np.array([*slots, *[model.pad_slot] * (bucket - b)], dtype=np.int64)
    replay = lambda: model.graphs.run(("decode", bucket), rows)  # noqa: E731
    row: dict[str, Any] = {"bucket": bucket, "replay_ms": gpu_ms(replay, dev, 20)}
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            replay()
        torch.cuda.synchronize(dev)
    by_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time > 0:
            by_name[e.name][0] += 1
            by_name[e.name][1] += e.device_time  # us
    table = sorted(by_name.items(), key=lambda kv: -kv[1][1])
    row["kernel_us_per_step"] = sum(v[1] for v in by_name.values()) / steps
    row["launches_per_step"] = sum(v[0] for v in by_name.values()) / steps
    row["kernels"] = [
        {"name": n[:120], "per_step": c / steps, "us_per_step": t / steps, "us_each": t / c}
        for n, (c, t) in table[:TOP]
    ]
    close_streams(model, slots)
    return row


def time_prefill(model: Any, b: int, t: int) -> dict[str, Any]:
    """The captured prefill graph of b prompts padded to t positions (padding slots: only KV is written)."""
    key = ("prefill", b, t)
    if not model.graphs.has(key):
        return {"missing": str(key)}
    rows = np.array([pack_prefill_row([0], [NO_CODEC], model.pad_slot, t)] * b, dtype=np.int64)
    return {"rows": b * t, "replay_ms": gpu_ms(lambda: model.graphs.run(key, rows), model.device, 20)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1.7b")
    ap.add_argument("--checkpoint", default=None)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--variants", default="fused")
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--context", type=int, default=60)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--max-batch", type=int, default=128)
    ap.add_argument("--max-slots", type=int, default=128)
    ap.add_argument("--max-seq-len", type=int, default=512)
    ap.add_argument("--max-prefill-batch", type=int, default=8)
    ap.add_argument("--prefill", default="", help="prefill graphs to time, BxT,... (e.g. 8x16,32x64)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dev = torch.device(args.device)
    res: dict[str, Any] = {"command": " ".join(sys.argv), "env": env(dev), "size": args.size, "variants": {}}
    batches = [int(x) for x in args.batches.split(",") if x]
    for variant in args.variants.split(","):
        fused = FUSED_VARIANTS.get(variant, FusedSettings())
        model = build(args, ExperimentalOptions(fused=fused), codec_mode="windowed")
        res["variants"][variant] = {}
        for bt in (x for x in args.prefill.split(",") if x):
            pb, pt = (int(v) for v in bt.split("x"))
            r = time_prefill(model, pb, pt)
            res["variants"][variant][f"prefill[{pb},{pt}]"] = r
            print(f"[profile {variant}] prefill[{pb},{pt}]: {r}", flush=True)
        for b in batches:
            r = profile_batch(model, b, args.context, args.steps)
            res["variants"][variant][str(b)] = r
            top = ", ".join(f"{k['name'][:40]} {k['us_per_step']:.0f}" for k in r["kernels"][:6])
            print(
                f"[profile {variant}] B={b}: replay {r['replay_ms']:.3f} ms, kernels "
                f"{r['kernel_us_per_step'] / 1e3:.3f} ms in {r['launches_per_step']:.0f} launches; {top}",
                flush=True,
            )
            Path(args.out).write_text(json.dumps(res, indent=1))
        del model
        gc.collect()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
