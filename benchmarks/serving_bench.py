"""Serving benchmark of the Qwen3-TTS engine on one GPU: frame step, codec, and the engine under load.

    # on the lent H200 (random weights with the real shapes, bf16; or --checkpoint DIR):
    python3 benchmarks/serving_bench.py --size 1.7b --sections step,codec,single,serve --out r.json --plot r.png
    # CPU smoke test of the harness (tiny model, seconds):
    python benchmarks/serving_bench.py --smoke --out /tmp/s.json --plot /tmp/s.png

Sections (each kept in the JSON even if another fails):

* ``step``: the frame step (talker step + 15 code-predictor passes + sampling of all 16 codebooks)
  per batch size, as ``fused`` (the served path: the decode work on fused Triton kernels,
  engine/qwen3/fused_decode.py, one CUDA graph per batch bucket), ``fused-eager`` (the same, not
  captured), ``fused-kernels`` / ``fused-cublas`` (the wide projections always on the fused kernel /
  always norm + cuBLAS, instead of switching above 8 rows), ``fused-nopdl`` / ``fused-noprefetch`` /
  ``fused-prefetch-all`` (no programmatic dependent launch / PDL without the L2 weight prefetch / whole
  weight bands prefetched, against 128 KiB per program), and on the unfused layers ``eager``,
  ``graphs`` and ``compile`` (graphs around torch.compile'd norms / RoPE / SwiGLU / sampler). GPU time
  by CUDA events over back-to-back replays; host-inclusive time = wall of ``model.generate``
  (input staging, replay, the one device->host copy, bookkeeping). Per stage (graphs): talker,
  code predictor (greedy picks), sampling + state updates (the rest of the tail), each captured
  alone. Beside it the weight-bytes floor: bytes a step must read (talker once, the code predictor's
  backbone once per pass) over the measured device copy rate. Also: graph replay == eager codes
  (greedy, real shapes).
* ``codec``: the streaming codec decoder per (streams, frames) graph, vs eager.
* ``single``: one stream at a time, 10-s utterances (125 frames): engine TTFP, end-to-end, RTF.
* ``serve``: the engine in-process (its worker thread, deadline-first scheduler, chunk schedule),
  requests from ``benchmarks/data/utterance_lengths.json`` (forced lengths, random weights):
  an open-loop Poisson sweep of request rates and a closed-loop concurrency sweep. Per request:
  TTFP (first text -> first audio chunk on the caller's loop), end-to-end, RTF; underruns with
  playback simulated from the first chunk and no extra buffer (a late chunk stalls playback, which
  resumes when it arrives); per-request and per-chunk on-time rates; aggregate audio-s/s; worker
  time split into frame steps and codec calls, and the frame-step GPU time from the ``step`` table;
  with ``--bursts``, n requests of ``--single-frames`` submitted at once (the official package's
  batched generate as a workload): aggregate audio-s/s, codec and streaming included.

The request side of ``serve`` (lengths, one request, the open / closed loops, bursts, the summary)
is benchmarks/engine_load.py.

Text: each request sends its whole text at once, then ends (the LLM-streaming case is tested
elsewhere); the talker still reads it one token per frame. Lead-in trimming is off (threshold
-300 dBFS): random weights have no leading silence, so TTFP is the first chunk out.

The length table was made with: rng = np.random.default_rng(20261129); 480 lognormal(log 3.4 s, 0.62)
+ 20 uniform(12, 30) s, shuffled, x 12.5 frames/s, rounded, clipped to [6, 375] frames.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine_load import (  # noqa: E402  (this script's folder is on sys.path)
    LENGTHS,
    WORDS,
    Lengths,
    burst,
    closed_loop,
    load_config,
    med,
    one_request,
    open_loop,
    pct,
    summarize,
)
from kernels_bench import copy_rate_gb_s  # noqa: E402

from voicewire.engine.config import ChunkSchedule  # noqa: E402
from voicewire.engine.engine import Engine  # noqa: E402
from voicewire.engine.model import StreamParams  # noqa: E402
from voicewire.engine.qwen3 import (  # noqa: E402
    ExperimentalOptions,
    FusedSettings,
    Qwen3TTSModel,
    ServeOptions,
    load_qwen3,
)
from voicewire.engine.qwen3.cuda_graphs import bucket_for  # noqa: E402


# --- helpers ---------------------------------------------------------------------------------------
def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def gpu_ms(fn: Callable[[], Any], dev: torch.device, iters: int, reps: int = 3) -> float:
    """Median over reps of (events around ``iters`` back-to-back calls) / iters; wall clock on CPU."""
    fn()
    sync(dev)
    out = []
    for _ in range(reps):
        if dev.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(iters):
                fn()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b) / iters)
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            out.append((time.perf_counter() - t0) * 1e3 / iters)
    return float(statistics.median(out))


def kernels_by_name(
    fn: Callable[[], Any], dev: torch.device, calls: int = 5, top: int = 30
) -> dict[str, Any]:
    """torch.profiler over ``calls`` runs of ``fn`` (CUPTI sees the kernels inside graph replays):
    kernel time and launches per call, and the ``top`` kernel names by time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize(dev)
    by: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time > 0:
            n_us = by.setdefault(e.name, [0, 0.0])
            n_us[0] += 1
            n_us[1] += e.device_time
    return {
        "kernel_us_per_call": sum(v[1] for v in by.values()) / calls,
        "launches_per_call": sum(v[0] for v in by.values()) / calls,
        "kernels": [
            {"name": n[:140], "per_call": c / calls, "us_per_call": us / calls}
            for n, (c, us) in sorted(by.items(), key=lambda kv: -kv[1][1])[:top]
        ],
    }


def capture(fn: Callable[[], Any], dev: torch.device) -> Callable[[], Any]:
    """fn as a replayable CUDA graph (identity off CUDA)."""
    if dev.type != "cuda":
        return fn
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        fn()
        fn()
    torch.cuda.current_stream(dev).wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def weight_bytes_per_step(model: Qwen3TTSModel) -> dict[str, float]:
    """Bytes of weights one frame step must read: the talker and the heads once, the code
    predictor's backbone once per pass (161 MB at 1.7B: larger than the 60 MB L2, re-read 15x)."""

    def nbytes(m: torch.nn.Module) -> int:
        return sum(p.numel() * p.element_size() for p in m.parameters())

    t, cp = model.talker, model.code_predictor
    passes = model.cfg.talker.num_code_groups - 1
    talker = sum(nbytes(layer) for layer in t.layers) + nbytes(t.norm) + nbytes(t.codec_head)
    cp_backbone = (
        sum(nbytes(layer) for layer in cp.layers) + nbytes(cp.norm) + nbytes(cp.small_to_mtp_projection)
    )
    heads = sum(nbytes(h) for h in cp.lm_head)
    return {
        "talker_bytes": float(talker),
        "code_predictor_bytes_per_pass": float(cp_backbone),
        "code_predictor_heads_bytes": float(heads),
        "step_bytes": float(talker + passes * cp_backbone + heads),
    }


def build(
    args: argparse.Namespace, experimental: ExperimentalOptions | None = None, **serve: Any
) -> Qwen3TTSModel:
    """The model under test: ``serve`` overrides ServeOptions fields, ``experimental`` picks a variant."""
    opts = ServeOptions(
        experimental=experimental or ExperimentalOptions(),
        max_slots=serve.pop("max_slots", args.max_slots),
        max_batch_size=serve.pop("max_batch_size", args.max_batch),
        max_seq_len=args.max_seq_len,
        max_prefill_batch=getattr(args, "max_prefill_batch", ServeOptions.max_prefill_batch),
        codec_batch_buckets=tuple(b for b in (1, 2, 4, 8, 16, 32, 64) if b <= args.max_batch),
        **serve,
    )
    torch.manual_seed(0)
    return load_qwen3(
        args.checkpoint, args.size, device=args.device, dtype=args.dtype, options=opts, warmup=True
    )


def open_streams(model: Qwen3TTSModel, slots: list[int], frames: int, greedy: bool) -> None:
    words = " ".join(WORDS * 4)
    for s in slots:
        model.open_slot(s, StreamParams(forced_frames=frames, seed=s + 1, greedy=greedy))
        model.add_text(s, [words], True)


def close_streams(model: Qwen3TTSModel, slots: list[int]) -> None:
    for s in slots:
        model.close_slot(s)


# --- section: step ---------------------------------------------------------------------------------
# FusedSettings of the fused variants that differ from the served defaults
FUSED_VARIANTS: dict[str, FusedSettings] = {
    "fused-kernels": FusedSettings(cublas_rows=1 << 20, residual_cublas_rows=1 << 20),  # no cuBLAS
    "fused-cublas": FusedSettings(cublas_rows=0, residual_cublas_rows=0),  # every linear on cuBLAS
    "fused-residual-fused": FusedSettings(residual_cublas_rows=1 << 20),  # o and down never on cuBLAS
    "fused-plain-prefill": FusedSettings(prefill=False),  # the prompt through the unfused talker layers
    "fused-nopdl": FusedSettings(pdl=False),  # every kernel launched plainly (kernels/pdl.py)
    "fused-noprefetch": FusedSettings(prefetch_kib=0),  # PDL without the L2 weight prefetch
    "fused-prefetch-all": FusedSettings(prefetch_kib=1 << 16),  # whole weight bands prefetched
    "fused-nogemv": FusedSettings(gemv_rows=0),  # one and two rows on the tiled kernel too
    "fused-gemv1": FusedSettings(gemv_rows=1),  # two rows on the tiled kernel
}


def section_step(args: argparse.Namespace, dev: torch.device) -> dict[str, Any]:
    out: dict[str, Any] = {"context_frames": args.step_context, "variants": {}}
    rate = copy_rate_gb_s() if dev.type == "cuda" else None
    out["copy_rate_gb_s"] = rate
    codes_by_variant: dict[str, np.ndarray] = {}
    for variant in args.step_variants:
        t0 = time.perf_counter()
        try:
            model = build(
                args,
                ExperimentalOptions(
                    compile_elementwise=variant == "compile",
                    fused_kernels=variant.startswith("fused"),
                    fused=FUSED_VARIANTS.get(variant, FusedSettings()),
                ),
                cuda_graphs=variant not in ("eager", "fused-eager"),
                codec_mode="windowed",  # no codec graphs needed here
            )
        except Exception as err:
            out["variants"][variant] = {"error": repr(err), "traceback": traceback.format_exc()[-2000:]}
            continue
        res: dict[str, Any] = {"build_and_capture_s": round(time.perf_counter() - t0, 1)}
        res["capture_s"] = round(model.graphs.capture_s, 1)
        res["graphs"] = len(model.graphs)
        if "floor" not in out:
            w = weight_bytes_per_step(model)
            out["floor"] = dict(w)
            if rate:
                out["floor"]["step_floor_ms"] = w["step_bytes"] / (rate * 1e9) * 1e3
        # graph replay == eager codes at the real shapes: greedy, 12 frames, one stream
        open_streams(model, [0], 12, greedy=True)
        frames = []
        while model.ready(0):
            r = model.generate([0])[0]
            frames.append(r.frames)
            if r.finished:
                break
        close_streams(model, [0])
        codes_by_variant[variant] = np.concatenate(frames)
        per_b: dict[str, Any] = {}
        batches = args.eager_batches if variant.endswith("eager") else args.step_batches
        for b in batches:
            if b <= args.max_batch:
                per_b[str(b)] = time_batch(model, b, args, dev)
                print(f"[step {variant}] B={b}: {json.dumps(per_b[str(b)])}", flush=True)
        res["batches"] = per_b
        out["variants"][variant] = res
        del model
        gc.collect()  # the graph catalog holds bound methods of the model: a reference cycle
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    # graph replay == eager: the unfused variants against "eager", the fused one against "fused-eager"
    out["greedy_codes_equal_eager"] = {}
    for v, c in codes_by_variant.items():
        base = codes_by_variant.get("fused-eager" if v.startswith("fused") else "eager")
        out["greedy_codes_equal_eager"][v] = bool(np.array_equal(c, base)) if base is not None else None
    return out


def time_batch(model: Qwen3TTSModel, b: int, args: argparse.Namespace, dev: torch.device) -> dict[str, Any]:
    slots = list(range(b))
    open_streams(model, slots, args.step_context + 200, greedy=False)
    model.generate(slots)  # prefill (in groups of max_prefill_batch)
    for _ in range(args.step_context):  # reach the context length of a typical stream
        model.generate(slots)
    row: dict[str, Any] = {}
    # host-inclusive: the whole generate() call, one device->host copy included
    walls = []
    for _ in range(args.step_iters):
        t1 = time.perf_counter()
        model.generate(slots)
        walls.append((time.perf_counter() - t1) * 1e3)
    row["generate_wall_ms_median"] = med(walls)
    row["generate_wall_ms_p90"] = pct(walls, 90)
    bucket = bucket_for(b, model.decode_buckets)
    idx = torch.full((bucket,), model.pad_slot, dtype=torch.int64, device=dev)
    idx[:b] = torch.arange(b, device=dev)
    step = model.step
    if model.graphs.enabled:
        rows = idx.cpu().numpy()
        row["step_gpu_ms"] = gpu_ms(lambda: model.graphs.run(("decode", bucket), rows), dev, 20)
        # stages, each captured alone on the same inputs
        frames_t, hidden = step.talker_step(idx)
        emb0 = model.talker.codec_embedding(hidden.new_zeros(bucket, dtype=torch.int64))
        talker = capture(lambda: step.talker_step(idx), dev)
        tail = capture(lambda: step.sample_tail(idx, frames_t, hidden), dev)
        if step.fused is not None:  # the fused predictor samples inside: its row includes 15 samplings
            fused, code0 = step.fused, hidden.new_zeros(bucket, dtype=torch.int64)
            idx32 = idx.to(torch.int32)
            cp = capture(lambda: fused.predict(hidden, code0, model.state, idx32, frames_t), dev)
        else:
            cp = capture(lambda: model.code_predictor.predict(hidden, emb0, lambda j, lg: lg.argmax(-1)), dev)
        row["talker_gpu_ms"] = gpu_ms(talker, dev, 20)
        row["code_predictor_gpu_ms"] = gpu_ms(cp, dev, 20)
        row["sampling_and_state_gpu_ms"] = gpu_ms(tail, dev, 20) - row["code_predictor_gpu_ms"]
    else:
        row["step_gpu_ms"] = gpu_ms(lambda: step.decode(idx), dev, 3)
    row["host_ms"] = row["generate_wall_ms_median"] - row["step_gpu_ms"]
    row["bucket"] = bucket
    close_streams(model, slots)
    return row


# --- section: codec --------------------------------------------------------------------------------
def section_codec(model: Qwen3TTSModel, args: argparse.Namespace, dev: torch.device) -> dict[str, Any]:
    q = model.cfg.talker.num_code_groups
    res: dict[str, Any] = {}
    rng = np.random.default_rng(0)

    def packed(b: int, t: int) -> np.ndarray:
        """b rows of t valid frames each, on slots 0..b-1 (reset when the serve section opens them)."""
        rows = rng.integers(0, 2048, (b, q * t + 2)).astype(np.int64)
        rows[:, -2], rows[:, -1] = t, np.arange(b)
        return rows

    for b in (1, 4, 16, 64):
        for t in (1, 2, 4, 12, 24, 48):
            if b > model.codec_runner.buckets[-1] or not model.graphs.has(("codec", b, t)):
                continue
            rows = packed(b, t)
            ms = gpu_ms(lambda rows=rows, b=b, t=t: model.graphs.run(("codec", b, t), rows), dev, 10)
            res[f"B{b}_T{t}"] = {"graph_ms": ms, "frames_per_s": b * t / (ms / 1e3)}
    for b, t in ((1, 1), (16, 4), (64, 12)):
        if b > model.codec_runner.buckets[-1]:
            continue
        x = torch.from_numpy(packed(b, t)).to(dev)
        res.setdefault(f"B{b}_T{t}", {})["eager_ms"] = gpu_ms(lambda x=x: model.codec_runner.body(x), dev, 3)
    return res


# --serve-variants: the engine's throughput levers on one built model (its graphs cover all of them)
SERVE_VARIANTS: dict[str, dict[str, Any]] = {
    "served": {},  # the defaults: the codec beside the frame step, long chunks when ahead
    "serial": {"overlap_decode": False, "chunks": ChunkSchedule(slack_frames=())},
    "serial-b128": {"overlap_decode": False, "chunks": ChunkSchedule(slack_frames=()), "max_batch": 128},
    "overlap": {"chunks": ChunkSchedule(slack_frames=())},
    "slack": {"overlap_decode": False},
    "b128": {"max_batch": 128},
    "b256": {"max_batch": 256},
    "noahead": {"queue_ahead": False},  # no frame step queued behind the running one
    "decodes2": {"max_decodes_in_flight": 2},  # two pieces of codec work queued beside the running one
    "nourgent": {"urgent_slack_s": 0.0},  # first chunks queued with the bulk codec work (no urgent lane)
    "nobudget": {"command_budget_s": math.inf},  # every queued command handled before the next step
    "budget2ms": {"command_budget_s": 0.002},  # the budget's first value (4e8e29a's "served")
    "nofreeze": {"freeze_heap": False},  # every collection walks the whole startup heap (heap.py)
}


def section_serve(
    model: Qwen3TTSModel, args: argparse.Namespace, variant: dict[str, Any] | None = None
) -> dict[str, Any]:
    cfg = load_config("qwen3-tts", args.max_slots, **(variant or {}))
    engine = Engine(cfg, model=model).start()
    res: dict[str, Any] = {"open_loop": [], "closed_loop": [], "single_10s": None}

    async def main() -> None:
        lengths = Lengths(args.length_scale)
        await closed_loop(engine, 4, 2.0, lengths, 999)  # warm the worker and the loop
        if "single" in args.sections:
            recs: list[dict[str, Any]] = []
            t0 = time.perf_counter()
            for i in range(args.single_n):
                await one_request(engine, args.single_frames, 7_000 + i, recs)
            s = summarize(recs, t0, time.perf_counter())
            s["frames"] = args.single_frames
            res["single_10s"] = s
            print(f"[single] {json.dumps(s)}", flush=True)
        if "serve" not in args.sections:
            return
        for k, rate in enumerate(args.rates):
            r = await open_loop(engine, rate, args.rate_duration_s, lengths, 1 + k)
            res["open_loop"].append(r)
            print(f"[open] {json.dumps(r)}", flush=True)
        for k, c in enumerate(args.concurrency):
            r = await closed_loop(engine, c, args.closed_duration_s, lengths, 50 + k)
            res["closed_loop"].append(r)
            print(f"[closed] {json.dumps(r)}", flush=True)
        for k, n in enumerate(args.bursts):
            r = await burst(engine, n, args.single_frames, 80 + k)
            res.setdefault("burst", []).append(r)
            print(f"[burst] {json.dumps(r)}", flush=True)

    try:
        asyncio.run(main())
    finally:
        engine.close()
    res["invalid_code_rows"] = model.invalid_code_rows
    return res


def plot(res: dict[str, Any], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [p for p in res.get("serve", {}).get("open_loop", []) if p.get("ttfp_ms_p50") is not None]
    if not pts:
        return
    fig, ax = plt.subplots(figsize=(7, 4.2))
    rates = [p["rate"] for p in pts]
    ax.plot(rates, [p["ttfp_ms_p50"] for p in pts], "o-", label="TTFP p50")
    ax.plot(rates, [p["ttfp_ms_p95"] for p in pts], "s-", label="TTFP p95")
    ax.axhline(100, color="grey", ls=":", lw=1)
    ax.set_xlabel("request rate (Poisson, req/s)")
    ax.set_ylabel("engine TTFP (ms)")
    ax.set_yscale("log")
    ax2 = ax.twinx()
    ax2.bar(
        rates,
        [p["underrun_requests"] / max(1, p["completed"]) * 100 for p in pts],
        width=max(rates) / 40,
        color="tab:red",
        alpha=0.35,
        label="requests with underruns (%)",
    )
    ax2.set_ylabel("requests with an underrun (%)")
    ax2.set_ylim(0, 100)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, loc="upper left", fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def env(dev: torch.device) -> dict[str, Any]:
    import platform

    e: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version(), "device": str(dev)}
    try:
        import triton

        e["triton"] = triton.__version__
    except ImportError:
        e["triton"] = None
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        e.update(gpu=p.name, sm_count=p.multi_processor_count, cuda=torch.version.cuda)
    return e


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1.7b")
    ap.add_argument("--checkpoint", default=None, help="official-layout directory instead of random weights")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--sections", default="step,codec,single,serve")
    ap.add_argument("--step-variants", default="fused-eager,fused,graphs,compile")
    ap.add_argument("--step-batches", default="1,8,32,64,128")
    ap.add_argument("--eager-batches", default="1,64", help="the eager variant is slow: fewer sizes")
    ap.add_argument("--step-context", type=int, default=60, help="frames generated before timing")
    ap.add_argument("--step-iters", type=int, default=20)
    ap.add_argument("--max-batch", type=int, default=128)
    ap.add_argument("--max-slots", type=int, default=256)
    ap.add_argument("--max-prefill-batch", type=int, default=ServeOptions.max_prefill_batch)
    ap.add_argument("--max-seq-len", type=int, default=512)
    ap.add_argument("--codec-frames", type=int, default=48, help="codec graphs up to this many frames")
    ap.add_argument(
        "--serve-variants",
        default="",
        help=f"serve: engine variants on the one model, each a sweep ({', '.join(SERVE_VARIANTS)}); '' = served",
    )
    ap.add_argument("--rates", default="1,10,20,40,60,80")
    ap.add_argument("--rate-duration-s", type=float, default=12.0)
    ap.add_argument("--concurrency", default="1,16,64,128")
    ap.add_argument("--closed-duration-s", type=float, default=8.0)
    ap.add_argument("--single-frames", type=int, default=125)
    ap.add_argument("--bursts", default="", help="serve: n requests of --single-frames at once, e.g. 128,256")
    ap.add_argument("--single-n", type=int, default=5)
    ap.add_argument("--length-scale", type=float, default=1.0)
    ap.add_argument("--compile", action="store_true", help="serve with torch.compile'd elementwise ops")
    ap.add_argument("--no-fused", action="store_true", help="serve on the unfused layers (no fused kernels)")
    ap.add_argument(
        "--codec-torch-ops",
        action="store_true",
        help="the codec's SnakeBeta, norms and SwiGLU on torch ops, not kernels",
    )
    ap.add_argument(
        "--codec-conv-kernel",
        choices=("served", "all", "off"),
        default="served",
        help="the codec's k > 1 convs on kernels/conv1d.py: as served (cuDNN for the small calls), at "
        "every call, or never (cuDNN's algorithms, timed per shape)",
    )
    ap.add_argument(
        "--cudnn-heuristics", action="store_true", help="codec graphs on cuDNN's heuristic conv algorithms"
    )
    ap.add_argument(
        "--warm-threads",
        type=int,
        default=ExperimentalOptions.warm_threads,
        help="threads the talker's graphs warm on, the codec's on one more (0: all on one)",
    )
    ap.add_argument(
        "--codec-warm-threads",
        type=int,
        default=ExperimentalOptions.codec_warm_threads,
        help="threads the codec's graphs warm on (cuDNN timing their convs), beside the talker's",
    )
    ap.add_argument(
        "--cudnn-benchmark-limit",
        type=int,
        default=ServeOptions.codec_cudnn_limit,
        help="conv algorithms cuDNN times per shape while the codec graphs are captured",
    )
    ap.add_argument("--smoke", action="store_true", help="tiny model on the CPU, short sweeps")
    ap.add_argument("--out", required=True)
    ap.add_argument("--plot", default=None)
    ap.add_argument("--command", default=" ".join(sys.argv), help="recorded in the JSON")
    args = ap.parse_args()
    if args.smoke:
        args.size, args.device, args.dtype = "tiny", "cpu", "float32"
        args.no_fused = True  # the fused kernels need CUDA (or the slow Triton interpreter)
        args.max_batch, args.max_slots, args.max_seq_len = 8, 16, 512
        args.step_variants, args.step_batches, args.step_iters, args.step_context = (
            "eager,graphs",
            "1,4",
            3,
            4,
        )
        args.rates, args.rate_duration_s, args.concurrency, args.closed_duration_s = "1,4", 2.0, "2", 2.0
        args.bursts = "3"
        args.single_frames, args.single_n, args.length_scale = 25, 2, 0.3
        torch.set_num_threads(2)
    args.sections = [s for s in args.sections.split(",") if s]
    args.step_variants = [s for s in args.step_variants.split(",") if s]
    args.step_batches = [int(x) for x in args.step_batches.split(",") if x]
    args.eager_batches = [int(x) for x in args.eager_batches.split(",") if x]
    args.rates = [float(x) for x in args.rates.split(",") if x]
    args.concurrency = [int(x) for x in args.concurrency.split(",") if x]
    args.bursts = [int(x) for x in args.bursts.split(",") if x]
    args.serve_variants = [v for v in args.serve_variants.split(",") if v]
    unknown = set(args.serve_variants) - set(SERVE_VARIANTS)
    if unknown:
        ap.error(f"unknown --serve-variants {sorted(unknown)}")
    dev = torch.device(args.device)
    res: dict[str, Any] = {
        "command": args.command,
        "env": env(dev),
        "size": args.size,
        "checkpoint": args.checkpoint,
        "dtype": args.dtype,
        "lengths": {k: v for k, v in json.loads(LENGTHS.read_text()).items() if k != "frames"},
    }
    res["lengths"]["scale"] = args.length_scale

    def save() -> None:
        Path(args.out).write_text(json.dumps(res, indent=1, default=str))

    def run(name: str, fn: Callable[[], Any]) -> None:
        t0 = time.perf_counter()
        print(f"== {name}", flush=True)
        try:
            res[name] = fn()
        except Exception as err:
            res[name] = {"error": repr(err), "traceback": traceback.format_exc()[-3000:]}
            print(res[name]["traceback"], flush=True)
        res.setdefault("seconds", {})[name] = round(time.perf_counter() - t0, 1)
        save()

    if "step" in args.sections:
        run("step", lambda: section_step(args, dev))
    if {"codec", "single", "serve"} & set(args.sections):
        t0 = time.perf_counter()
        model = build(
            args,
            ExperimentalOptions(
                compile_elementwise=args.compile,
                fused_kernels=not args.no_fused,
                codec_kernels=False if args.codec_torch_ops else None,
                codec_conv_kernel=False if args.codec_conv_kernel == "off" else None,
                codec_conv_kernel_min_frames=(
                    0 if args.codec_conv_kernel == "all" else ExperimentalOptions.codec_conv_kernel_min_frames
                ),
                warm_threads=args.warm_threads,
                codec_warm_threads=args.codec_warm_threads,
            ),
            codec_cudnn_benchmark=not args.cudnn_heuristics,
            codec_cudnn_limit=args.cudnn_benchmark_limit,
            codec_graph_frames=args.codec_frames,
        )
        res["serve_model"] = {
            "compile_elementwise": args.compile,
            "fused_kernels": not args.no_fused,
            "codec_kernels": not args.codec_torch_ops,
            "codec_conv_kernel": args.codec_conv_kernel,
            "codec_cudnn_benchmark": not args.cudnn_heuristics,
            "warm_threads": args.warm_threads,
            "codec_warm_threads": args.codec_warm_threads,
            "build_and_capture_s": round(time.perf_counter() - t0, 1),
            "capture_s": round(model.graphs.capture_s, 1),
            "cudnn_benchmark_limit": model.options.codec_cudnn_limit,
            "capture_by_kind_s": model.graphs.phase_s,
            "warmups_s": model.graphs.eager_seconds(),
            "graphs": len(model.graphs),
            "decode_buckets": model.decode_buckets,
            "codec_buckets": model.codec_runner.buckets,
        }
        if "codec" in args.sections:
            run("codec", lambda: section_codec(model, args, dev))
        for name in args.serve_variants:
            run(f"serve_{name}", lambda name=name: section_serve(model, args, SERVE_VARIANTS[name]))
            for p in res.get(f"serve_{name}", {}).get("open_loop", []):
                p.pop("arrivals", None)
        if {"single", "serve"} & set(args.sections) and not args.serve_variants:
            run("serve", lambda: section_serve(model, args))
            for p in res.get("serve", {}).get("open_loop", []) + res.get("serve", {}).get("closed_loop", []):
                p.pop("arrivals", None)
    # frame-step GPU time of the serve runs, from the step table's row of the variant served (--compile
    # compiles the unfused layers: the fused decode step does not use them)
    served = "fused" if not args.no_fused else "compile" if args.compile else "graphs"
    table = res.get("step", {}).get("variants", {}).get(served, {}).get("batches", {})
    if table:
        for p in res.get("serve", {}).get("open_loop", []) + res.get("serve", {}).get("closed_loop", []):
            est = 0.0
            for b, n in p["engine"]["batch_hist"].items():
                near = min(table, key=lambda k, b=b: abs(int(k) - int(b)))
                est += n * table[near]["step_gpu_ms"] / 1e3
            p["engine"]["frame_step_gpu_s_estimate"] = est
    save()
    if args.plot:
        title = f"Qwen3-TTS-{args.size} {args.dtype}, {res['env'].get('gpu', args.device)}: engine TTFP vs Poisson rate"
        plot(res, args.plot, title)
    print(json.dumps({k: v for k, v in res.items() if k in ("step", "codec")}, default=str)[:6000])


if __name__ == "__main__":
    main()
