"""Kernel benchmark: our Triton attention kernels against torch's scaled_dot_product_attention (SDPA).

    python benchmarks/kernels_bench.py --out results.json           # CUDA: the real numbers (~3-5 min)
    python benchmarks/kernels_bench.py --smoke --out /tmp/k.json    # CPU, Triton interpreter, tiny shapes

What is compared (bf16, one H200):

* Talker decode attention, 16 query / 8 KV heads x 128, one query token per row, batch 1-128, context
  128 / 512 / 2048:
  - `uniform`: every row has exactly `context` keys. SDPA gets each row's K/V as one contiguous
    (B, 8, L, 128) tensor (our cache with slot b = row b), no mask, enable_gqa=True: its best case
    (FlashAttention's decode path can run; no gather, no padding). Our kernel reads the same tensors
    through slot_idx / lengths.
  - `mixed`: lengths uniform in [1, context] (streams at different points of their utterances). The
    engine-side SDPA alternative is the padded batch: the same (B, 8, L, 128) tensors plus a boolean
    key mask (B, 1, 1, L); per-length calls would cost B launches per layer. Our kernel reads only the
    valid keys.
  Every SDPA backend that accepts the call is timed (default pick, flash, efficient, cuDNN); the
  speed-up is reported against the default pick and against the fastest backend.
* Codec decoder sliding-window attention, 16 heads x 64, window 72, streams 1-128, chunk T = 1/4/16
  frames, each stream with a full 71-frame history. SDPA gets the window already laid out as contiguous
  (S, 16, 71 + T, 64) K/V with a (T, 71 + T) boolean mask (`sdpa`), and, as the engine would need,
  after concatenating the history with the chunk (`sdpa+cat`). Ours reads the ring in place and appends
  the chunk to it (update_cache=True), the op the decoder runs.

Timing: each measured function calls the op once per "layer" over `rotation` distinct copies of the
inputs, enough that they add up to >= 4x the L2 cache, so every call reads HBM (in the model, 2.8 GB of
weights stream through L2 between two attention calls of a layer). The function is captured in a CUDA
graph and replayed; CUDA events around back-to-back replays; the median over repeats, divided by the
calls per replay, is the time per call. Achieved GB/s = bytes the op must move (K/V read over the valid
keys + q + out, and ring writes for the codec op) / time, against the measured device-to-device copy rate
(bytes read + written). Smoke mode uses wall clock and tells nothing about speed: it checks the script.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

REPO_ROOT = Path(__file__).resolve().parents[1]

TALKER_Q_HEADS, TALKER_KV_HEADS, TALKER_HEAD_DIM = 16, 8, 128
CODEC_HEADS, CODEC_HEAD_DIM, CODEC_WINDOW = 16, 64, 72
BATCHES = (1, 4, 16, 64, 128)
CONTEXTS = (128, 512, 2048)
CODEC_STREAMS = (1, 16, 64, 128)
CODEC_CHUNKS = (1, 4, 16)
# Acceptance (issue 5): decode attention >= 1.3x faster than SDPA at batch >= 16 on the talker shapes.
ACCEPT_SPEEDUP = 1.3
ACCEPT_MIN_BATCH = 16
# Distinct input copies must add up to this many L2 sizes, so no call finds its K/V in L2.
L2_MULTIPLE = 4
MIN_ROTATION, MAX_ROTATION = 4, 512
# H200 L2 (60 MB) if the device does not say.
FALLBACK_L2_BYTES = 60 * 2**20
COPY_BYTES = 2**31  # 2 GiB device-to-device copy for the bandwidth ceiling
REPLAYS_PER_SAMPLE, SAMPLES = 5, 10
# Config sweep for the decode kernel (block_n, num_warps, num_stages) x forced splits; the default plan is
# always timed too. The best config per shape tells how to retune the defaults.
SWEEP_TILES = ((32, 4, 3), (64, 4, 2), (64, 4, 3), (64, 8, 3), (128, 4, 2), (128, 8, 3))
SWEEP_SPLITS = (1, 2, 4, 8, 16)
# Smoke mode: the interpreter runs a few hundred programs per second on one core.
SMOKE_BATCHES, SMOKE_CONTEXTS = (1, 2), (64, 160)
SMOKE_STREAMS, SMOKE_CHUNKS = (1, 2), (1, 3)
SMOKE_SWEEP_TILES = ((32, 4, 3),)
SMOKE_SWEEP_SPLITS = (1, 2)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", required=True, type=Path, help="where to write the JSON results")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny shapes; on a CPU runs the Triton interpreter"
    )
    parser.add_argument("--no-sweep", action="store_true", help="time only the default decode plan")
    return parser.parse_args()


DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
ON_CUDA = DEVICE.type == "cuda"
# bf16 is what serving runs; the CPU interpreter's tl.dot cannot multiply bf16, so smoke runs fp32.
DTYPE = torch.bfloat16 if ON_CUDA else torch.float32
SDPA_BACKENDS: dict[str, list[SDPBackend] | None] = (
    {
        "default": None,
        "flash": [SDPBackend.FLASH_ATTENTION],
        "efficient": [SDPBackend.EFFICIENT_ATTENTION],
        "cudnn": [SDPBackend.CUDNN_ATTENTION],
    }
    if ON_CUDA
    else {"default": None}
)


def backend_context(backends: list[SDPBackend] | None) -> AbstractContextManager[Any]:
    return nullcontext() if backends is None else sdpa_kernel(backends)


def sync() -> None:
    if ON_CUDA:
        torch.cuda.synchronize()


def time_per_call_us(fn: Callable[[], None], calls: int) -> tuple[float, bool]:
    """Median time of one op call in us, `fn` making `calls` of them; also whether it ran as a graph."""
    fn()  # compile, pick kernels, allocate
    sync()
    if not ON_CUDA:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e6 / calls, False
    run: Callable[[], None] = fn
    graphed = True
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()  # warm-up on a side stream, as torch's graph docs ask
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        run = graph.replay
    except RuntimeError:
        graphed = False
        sync()
    run()
    sync()
    start_ev, end_ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(SAMPLES):
        start_ev.record()
        for _ in range(REPLAYS_PER_SAMPLE):
            run()
        end_ev.record()
        end_ev.synchronize()
        samples.append(start_ev.elapsed_time(end_ev) * 1e3 / (REPLAYS_PER_SAMPLE * calls))
    return statistics.median(samples), graphed


def try_time(fn: Callable[[], None], calls: int) -> dict[str, Any]:
    try:
        us, graphed = time_per_call_us(fn, calls)
    except RuntimeError as err:  # a backend that refuses these shapes or this mask
        sync()
        return {"error": str(err).splitlines()[0][:200]}
    return {"us": round(us, 3), "graphed": graphed}


def copy_rate_gb_s() -> float:
    """Device-to-device copy, bytes read + written per second: the ceiling for a memory-bound kernel.

    Timed eagerly, not in a CUDA graph: captured, the copy is a memcpy node and ran at 2.71-2.77 TB/s on
    the H200 (likely the copy engines; fused_h200 runs 18-22), eagerly at 4.21-4.26 TB/s (runs 21, 23),
    and the latter is what a kernel's own loads and stores can reach."""
    numel = (COPY_BYTES if ON_CUDA else 2**26) // 2
    src = torch.randn(numel, device=DEVICE, dtype=torch.bfloat16 if ON_CUDA else torch.float16)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up (and the clocks up)
    sync()
    if not ON_CUDA:
        start = time.perf_counter()
        dst.copy_(src)
        seconds = time.perf_counter() - start
    else:
        start_ev, end_ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        seconds = float("inf")
        for _ in range(SAMPLES):
            start_ev.record()
            dst.copy_(src)
            end_ev.record()
            end_ev.synchronize()
            seconds = min(seconds, start_ev.elapsed_time(end_ev) / 1e3)
    return 2 * src.numel() * src.element_size() / seconds / 1e9


def l2_bytes() -> int:
    if not ON_CUDA:
        return 2**20
    return int(getattr(torch.cuda.get_device_properties(DEVICE), "L2_cache_size", FALLBACK_L2_BYTES))


def rotation_for(bytes_per_call: int) -> int:
    if not ON_CUDA:
        return 1
    return max(MIN_ROTATION, min(MAX_ROTATION, math.ceil(L2_MULTIPLE * l2_bytes() / bytes_per_call)))


def release_memory() -> None:
    if ON_CUDA:
        torch.cuda.empty_cache()


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm())


def gb_s(bytes_moved: int, us: float) -> float:
    return bytes_moved / (us * 1e-6) / 1e9


def decode_shapes(smoke: bool) -> Iterator[tuple[int, int, str]]:
    batches, contexts = (SMOKE_BATCHES, SMOKE_CONTEXTS) if smoke else (BATCHES, CONTEXTS)
    for context in contexts:
        for batch in batches:
            yield batch, context, "uniform"
            # Mixed lengths only where the acceptance applies (and where a padded batch is realistic).
            if batch >= ACCEPT_MIN_BATCH or (smoke and batch > 1):
                yield batch, context, "mixed"


def bench_decode(
    batch: int, context: int, lengths_kind: str, sweep: bool, smoke: bool, copy_gb_s: float
) -> dict[str, Any]:
    from voicewire.kernels.decode_attention import decode_attention
    from voicewire.kernels.decode_attention_plan import plan_decode_attention

    gen = torch.Generator().manual_seed(batch * 10_000 + context)
    if lengths_kind == "uniform":
        lengths_host = torch.full((batch,), context, dtype=torch.int32)
    else:
        lengths_host = torch.randint(1, context + 1, (batch,), generator=gen, dtype=torch.int32)
    elem = torch.finfo(DTYPE).bits // 8
    kv_bytes = int(lengths_host.sum()) * TALKER_KV_HEADS * TALKER_HEAD_DIM * 2 * elem  # K and V, valid keys
    qo_bytes = 2 * batch * TALKER_Q_HEADS * TALKER_HEAD_DIM * elem
    useful_bytes = kv_bytes + qo_bytes
    cache_bytes = batch * TALKER_KV_HEADS * context * TALKER_HEAD_DIM * 2 * elem
    rotation = rotation_for(cache_bytes)

    scale = TALKER_HEAD_DIM**-0.5
    qs = [
        torch.randn(batch, TALKER_Q_HEADS, TALKER_HEAD_DIM, device=DEVICE, dtype=DTYPE)
        for _ in range(rotation)
    ]
    # Slot b = row b, so the (num_slots, 8, L, 128) cache is also SDPA's (B, 8, L, 128) K/V.
    ks = [
        torch.randn(batch, TALKER_KV_HEADS, context, TALKER_HEAD_DIM, device=DEVICE, dtype=DTYPE)
        for _ in range(rotation)
    ]
    vs = [torch.randn_like(k) for k in ks]
    outs = [torch.empty_like(q) for q in qs]
    slots = torch.arange(batch, dtype=torch.int32, device=DEVICE)
    lengths = lengths_host.to(DEVICE)
    key_mask = (torch.arange(context, device=DEVICE)[None, :] < lengths[:, None].long())[
        :, None, None, :
    ]  # (B, 1, 1, L)
    sdpa_mask = None if lengths_kind == "uniform" else key_mask

    def ours(plan: Any) -> Callable[[], None]:
        def fn() -> None:
            for i in range(rotation):
                decode_attention(qs[i], ks[i], vs[i], slots, lengths, scale=scale, plan=plan, out=outs[i])

        return fn

    def sdpa(backends: list[SDPBackend] | None) -> Callable[[], None]:
        def fn() -> None:
            with backend_context(backends):
                for i in range(rotation):
                    F.scaled_dot_product_attention(
                        qs[i][:, :, None], ks[i], vs[i], attn_mask=sdpa_mask, scale=scale, enable_gqa=True
                    )

        return fn

    default_plan = plan_decode_attention(batch, TALKER_KV_HEADS, context, DEVICE, DTYPE)
    result: dict[str, Any] = {
        "batch": batch,
        "context": context,
        "lengths": lengths_kind,
        "mean_length": round(float(lengths_host.float().mean()), 1),
        "useful_bytes": useful_bytes,
        "rotation": rotation,
    }
    ours_default = try_time(ours(default_plan), rotation)
    ours_default["plan"] = vars(default_plan)
    result["ours"] = ours_default

    # Correctness cross-check against SDPA (default backend) on the first copy.
    ours(default_plan)()
    with torch.no_grad():
        ref = F.scaled_dot_product_attention(
            qs[0][:, :, None], ks[0], vs[0], attn_mask=sdpa_mask, scale=scale, enable_gqa=True
        )
    result["rel_err_vs_sdpa"] = rel_err(outs[0], ref[:, :, 0])

    if sweep and lengths_kind == "uniform":  # mixed rows reuse the uniform row's verdict on configs
        tiles = SMOKE_SWEEP_TILES if smoke else SWEEP_TILES
        best: dict[str, Any] | None = None
        seen = set()
        for block_n, num_warps, num_stages in tiles:
            for splits in (*(SMOKE_SWEEP_SPLITS if smoke else SWEEP_SPLITS), default_plan.num_splits):
                plan = plan_decode_attention(
                    batch, TALKER_KV_HEADS, context, DEVICE, DTYPE,
                    num_splits=splits, block_n=block_n, num_warps=num_warps, num_stages=num_stages,
                )  # fmt: skip
                key = (plan.num_splits, block_n, num_warps, num_stages)
                if key in seen:
                    continue
                seen.add(key)
                timing = try_time(ours(plan), rotation)
                if "us" in timing and (best is None or timing["us"] < best["us"]):
                    best = {"us": timing["us"], "plan": vars(plan)}
        result["ours_best_config"] = best

    sdpa_results = {name: try_time(sdpa(backends), rotation) for name, backends in SDPA_BACKENDS.items()}
    result["sdpa"] = sdpa_results
    timed = {name: r["us"] for name, r in sdpa_results.items() if "us" in r}
    if "us" in ours_default and timed:
        ours_us = ours_default["us"]
        best_name = min(timed, key=timed.__getitem__)
        result["ours_gb_s"] = round(gb_s(useful_bytes, ours_us), 1)
        result["ours_fraction_of_copy"] = round(gb_s(useful_bytes, ours_us) / copy_gb_s, 3)
        result["sdpa_best_backend"] = best_name
        result["sdpa_best_gb_s"] = round(gb_s(useful_bytes, timed[best_name]), 1)
        if "default" in timed:
            result["speedup_vs_sdpa_default"] = round(timed["default"] / ours_us, 3)
        result["speedup_vs_sdpa_best"] = round(timed[best_name] / ours_us, 3)
    return result


def bench_window(streams: int, chunk: int, copy_gb_s: float) -> dict[str, Any]:
    # not in the served tree: the codec does not use it yet (benchmarks/sliding_window/)
    from benchmarks.sliding_window.sliding_window_attention import sliding_window_attention

    history = CODEC_WINDOW - 1  # frames of the past a full window needs
    position = 10 * CODEC_WINDOW  # well past the start: every stream has a full window
    elem = torch.finfo(DTYPE).bits // 8
    per_head = (2 * history + 4 * chunk + 2 * chunk) * CODEC_HEAD_DIM  # ring read; q, k, v, out; ring writes
    useful_bytes = streams * CODEC_HEADS * per_head * elem
    rotation = rotation_for(useful_bytes)
    scale = CODEC_HEAD_DIM**-0.5

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=DEVICE, dtype=DTYPE)

    qs = [rand(streams, CODEC_HEADS, chunk, CODEC_HEAD_DIM) for _ in range(rotation)]
    k_news = [torch.randn_like(q) for q in qs]
    v_news = [torch.randn_like(q) for q in qs]
    k_hists = [rand(streams, CODEC_HEADS, history, CODEC_HEAD_DIM) for _ in range(rotation)]
    v_hists = [torch.randn_like(k) for k in k_hists]
    ring_idx = torch.arange(position - history, position, device=DEVICE) % CODEC_WINDOW
    k_rings, v_rings = [], []
    for k_hist, v_hist in zip(k_hists, v_hists, strict=True):
        k_ring = torch.zeros(streams, CODEC_HEADS, CODEC_WINDOW, CODEC_HEAD_DIM, device=DEVICE, dtype=DTYPE)
        v_ring = torch.zeros_like(k_ring)
        k_ring[:, :, ring_idx], v_ring[:, :, ring_idx] = k_hist, v_hist
        k_rings.append(k_ring)
        v_rings.append(v_ring)
    k_wins = [torch.cat([h, n], dim=2) for h, n in zip(k_hists, k_news, strict=True)]  # (S, H, 71 + T, D)
    v_wins = [torch.cat([h, n], dim=2) for h, n in zip(v_hists, v_news, strict=True)]
    outs = [torch.empty_like(q) for q in qs]
    slots = torch.arange(streams, dtype=torch.int32, device=DEVICE)
    positions = torch.full((streams,), position, dtype=torch.int32, device=DEVICE)
    query_pos = torch.arange(history, history + chunk, device=DEVICE)
    key_pos = torch.arange(history + chunk, device=DEVICE)
    delta = query_pos[:, None] - key_pos[None, :]
    mask = (delta >= 0) & (delta < CODEC_WINDOW)  # (T, 71 + T)

    def ours(update_cache: bool) -> Callable[[], None]:
        def fn() -> None:
            for i in range(rotation):
                sliding_window_attention(
                    qs[i], k_news[i], v_news[i], k_rings[i], v_rings[i], slots, positions,
                    scale=scale, update_cache=update_cache, out=outs[i],
                )  # fmt: skip

        return fn

    def sdpa(backends: list[SDPBackend] | None, concat: bool) -> Callable[[], None]:
        def fn() -> None:
            with backend_context(backends):
                for i in range(rotation):
                    k_win = torch.cat([k_hists[i], k_news[i]], dim=2) if concat else k_wins[i]
                    v_win = torch.cat([v_hists[i], v_news[i]], dim=2) if concat else v_wins[i]
                    F.scaled_dot_product_attention(qs[i], k_win, v_win, attn_mask=mask, scale=scale)

        return fn

    ours(False)()  # check before any append changes the rings
    ref = F.scaled_dot_product_attention(qs[0], k_wins[0], v_wins[0], attn_mask=mask, scale=scale)
    result: dict[str, Any] = {
        "streams": streams,
        "chunk_frames": chunk,
        "useful_bytes": useful_bytes,
        "rotation": rotation,
        "rel_err_vs_sdpa": rel_err(outs[0], ref),
        "ours": try_time(ours(True), rotation),
    }
    sdpa_results: dict[str, Any] = {}
    for name, backends in SDPA_BACKENDS.items():
        sdpa_results[name] = try_time(sdpa(backends, concat=False), rotation)
    sdpa_results["default+cat"] = try_time(sdpa(None, concat=True), rotation)
    result["sdpa"] = sdpa_results
    timed = {name: r["us"] for name, r in sdpa_results.items() if "us" in r and "+cat" not in name}
    if "us" in result["ours"] and timed:
        ours_us = result["ours"]["us"]
        best_name = min(timed, key=timed.__getitem__)
        result["ours_gb_s"] = round(gb_s(useful_bytes, ours_us), 1)
        result["ours_fraction_of_copy"] = round(gb_s(useful_bytes, ours_us) / copy_gb_s, 3)
        result["sdpa_best_backend"] = best_name
        result["speedup_vs_sdpa_best"] = round(timed[best_name] / ours_us, 3)
        if "us" in sdpa_results["default+cat"]:
            result["speedup_vs_sdpa_default_with_cat"] = round(sdpa_results["default+cat"]["us"] / ours_us, 3)
    return result


def acceptance(decode_rows: list[dict[str, Any]]) -> dict[str, Any]:
    rows = [r for r in decode_rows if r["batch"] >= ACCEPT_MIN_BATCH and "speedup_vs_sdpa_best" in r]
    checks = [
        {
            "batch": r["batch"],
            "context": r["context"],
            "lengths": r["lengths"],
            "speedup_vs_sdpa_default": r.get("speedup_vs_sdpa_default"),
            "speedup_vs_sdpa_best": r["speedup_vs_sdpa_best"],
            "pass_vs_default": (r.get("speedup_vs_sdpa_default") or 0.0) >= ACCEPT_SPEEDUP,
            "pass_vs_best": r["speedup_vs_sdpa_best"] >= ACCEPT_SPEEDUP,
        }
        for r in rows
    ]
    return {
        "target": f"decode attention >= {ACCEPT_SPEEDUP}x SDPA at batch >= {ACCEPT_MIN_BATCH}",
        # None when no shape qualifies (the smoke run's tiny batches).
        "all_pass_vs_default": all(c["pass_vs_default"] for c in checks) if checks else None,
        "all_pass_vs_best": all(c["pass_vs_best"] for c in checks) if checks else None,
        "checks": checks,
    }


def device_info() -> dict[str, Any]:
    import triton

    info: dict[str, Any] = {
        "device": torch.cuda.get_device_name(DEVICE) if ON_CUDA else platform.processor() or "cpu",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "dtype": str(DTYPE),
        "interpreter": os.environ.get("TRITON_INTERPRET", "0"),
    }
    if ON_CUDA:
        props = torch.cuda.get_device_properties(DEVICE)
        info.update(multiprocessors=props.multi_processor_count, l2_bytes=l2_bytes(), cuda=torch.version.cuda)
    return info


def fmt(value: Any, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def print_tables(results: dict[str, Any]) -> None:
    print(f"copy rate {results['copy_rate_gb_s']:.0f} GB/s on {results['env']['device']}")
    print("decode attention (us per call; speed-up = SDPA / ours)")
    print(
        f"{'B':>4} {'L':>5} {'lens':>7} {'ours':>8} {'GB/s':>7} {'%copy':>6} {'best cfg':>8} {'sdpa':>8} {'backend':>9} {'x dflt':>7} {'x best':>7}"
    )
    for r in results["decode_attention"]:
        sdpa_default = r["sdpa"].get("default", {}).get("us")
        best_cfg = (r.get("ours_best_config") or {}).get("us")
        frac = r.get("ours_fraction_of_copy")
        print(
            f"{r['batch']:>4} {r['context']:>5} {r['lengths']:>7} {fmt(r['ours'].get('us'), '.2f'):>8} "
            f"{fmt(r.get('ours_gb_s'), '.0f'):>7} {fmt(None if frac is None else 100 * frac, '.0f'):>6} "
            f"{fmt(best_cfg, '.2f'):>8} {fmt(sdpa_default, '.2f'):>8} {r.get('sdpa_best_backend', '-'):>9} "
            f"{fmt(r.get('speedup_vs_sdpa_default'), '.2f'):>7} {fmt(r.get('speedup_vs_sdpa_best'), '.2f'):>7}"
        )
    print("codec sliding-window attention (us per call)")
    print(f"{'S':>4} {'T':>3} {'ours':>8} {'GB/s':>7} {'sdpa':>8} {'+cat':>8} {'x best':>7} {'x +cat':>7}")
    for r in results["sliding_window_attention"]:
        print(
            f"{r['streams']:>4} {r['chunk_frames']:>3} {fmt(r['ours'].get('us'), '.2f'):>8} "
            f"{fmt(r.get('ours_gb_s'), '.0f'):>7} {fmt(r['sdpa'].get('default', {}).get('us'), '.2f'):>8} "
            f"{fmt(r['sdpa'].get('default+cat', {}).get('us'), '.2f'):>8} "
            f"{fmt(r.get('speedup_vs_sdpa_best'), '.2f'):>7} {fmt(r.get('speedup_vs_sdpa_default_with_cat'), '.2f'):>7}"
        )
    acc = results["acceptance"]
    print(
        f"acceptance ({acc['target']}): vs default {acc['all_pass_vs_default']}, vs best backend {acc['all_pass_vs_best']}"
    )


def main() -> None:
    args = parse_args()
    if not ON_CUDA and not args.smoke:
        raise SystemExit("no CUDA device: run with --smoke (CPU interpreter, tiny shapes) or on the GPU")
    if not ON_CUDA:
        # Before the kernel modules are imported (their @triton.jit reads it): run in the CPU interpreter.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    sys.path.insert(0, str(REPO_ROOT))  # `kernels` without an installed package
    # SDPA warns for every backend that refuses a shape; the refusals are recorded in the JSON instead.
    warnings.filterwarnings("ignore", category=UserWarning)
    torch.manual_seed(0)
    started = time.perf_counter()
    copy_gb_s = copy_rate_gb_s()
    sweep = not args.no_sweep
    results: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "mode": "smoke" if args.smoke else "full",
        "env": device_info(),
        "copy_rate_gb_s": round(copy_gb_s, 1),
        "method": __doc__,
        "decode_attention": [],
        "sliding_window_attention": [],
    }
    print(f"copy rate {copy_gb_s:.0f} GB/s", flush=True)

    def save() -> None:
        # After every shape: a run cut off by a time limit still leaves its finished rows.
        results["acceptance"] = acceptance(results["decode_attention"])
        results["wall_s"] = round(time.perf_counter() - started, 1)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")

    with torch.no_grad():
        for batch, context, kind in decode_shapes(args.smoke):
            row = bench_decode(batch, context, kind, sweep, args.smoke, copy_gb_s)
            results["decode_attention"].append(row)
            release_memory()  # the shape's inputs (up to ~4 GB) are garbage now
            save()
            print(f"decode B={batch} L={context} {kind}: ours {row['ours'].get('us')} us", flush=True)
        streams, chunks = (SMOKE_STREAMS, SMOKE_CHUNKS) if args.smoke else (CODEC_STREAMS, CODEC_CHUNKS)
        for stream_count in streams:
            for chunk in chunks:
                row = bench_window(stream_count, chunk, copy_gb_s)
                results["sliding_window_attention"].append(row)
                release_memory()
                save()
    print_tables(results)
    print(f"wrote {args.out} in {results['wall_s']} s")


if __name__ == "__main__":
    main()
